"""The one way omnitrace starts a Python child of its own (agent, server, bench, report).

``python -m pkg`` puts the current directory first on ``sys.path``: started from the
folder that holds a checkout named ``omnitrace`` (``~`` after cloning into
``~/omnitrace``), the child would import that folder instead of the installed package.
Python >= 3.11 has ``-P`` (no unsafe path entry); 3.10 runs the module through ``-c``
with the empty entry ('' = the current directory) taken off first. Either way the child
sees the parent's interpreter and the installed package, never the cwd.

``start`` also starts such a child with SIGINT blocked until it can take a Ctrl-C.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import subprocess
import sys
from typing import Any

# 3.10: `-c CODE MODULE ARGS...` -> sys.argv == ['-c', MODULE, ARGS...] and sys.path[0] == ''
_RUN_MODULE = ("import runpy, sys\n"
               "if sys.path and sys.path[0] == '': del sys.path[0]\n"
               "del sys.argv[0]\n"
               "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")

HAS_SAFE_PATH_FLAG = sys.version_info >= (3, 11)


def python_module(module: str, *args: str, safe_flag: bool = HAS_SAFE_PATH_FLAG) -> list[str]:
    """argv that runs ``python -m MODULE ARGS`` without the cwd on ``sys.path``."""
    if safe_flag:
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _RUN_MODULE, module, *args]


def module_of(argv: list[str]) -> str | None:
    """The module a Python command line runs (``-m`` after interpreter options, or the
    3.10 form above); None for a script or anything else. Used to name processes."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-X", "-W"):  # options that take a value
            i += 2
            continue
        if a == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if a == "-c":
            return argv[i + 2] if argv[i + 1:i + 2] == [_RUN_MODULE] and i + 2 < len(argv) else None
        if not a.startswith("-"):
            return None
        i += 1
    return None


def start(cmd: list[str], **popen_kw: Any) -> subprocess.Popen:
    """Popen ``cmd`` (one of ours: it calls accept_sigint() once it can take a Ctrl-C)
    with SIGINT blocked. A Ctrl-C on the terminal reaches the whole process group; one
    that lands while the child's interpreter starts and imports would kill it with a
    traceback. Blocked, it stays pending (the mask survives exec, and Python leaves it as
    it finds it) and is taken where the child handles it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return subprocess.Popen(cmd, **popen_kw)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def accept_sigint() -> None:
    """From here on a Ctrl-C (one pending from start-up included) is delivered."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def fork_available() -> bool:
    """Whether a forked child can take work here (not on Windows, nor where Python has no
    fork start method)."""
    return sys.platform != "win32" and "fork" in mp.get_all_start_methods()
