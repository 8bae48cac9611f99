"""The one way omnitrace starts a Python child of its own (agent, server, bench, report).

``python -m pkg`` puts the current directory first on ``sys.path``: started from the
folder that holds a checkout named ``omnitrace`` (``~`` after cloning into
``~/omnitrace``), the child would import that folder instead of the installed package.
Python >= 3.11 has ``-P`` (no unsafe path entry); 3.10 runs the module through ``-c``
with the empty entry ('' = the current directory) taken off first. Either way the child
sees the parent's interpreter and the installed package, never the cwd.

``start`` also starts such a child with SIGINT blocked until it can take a Ctrl-C, and
bound to its parent: when the parent dies (even by SIGKILL) the child gets SIGHUP, its
launcher hung up, and stops as it would on Ctrl-C (:func:`stop_like_ctrl_c`). So a signal
to any omnitrace command reaches the whole tree, and no child outlives a killed parent.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import weakref
from typing import Any, Callable

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


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_children: "weakref.WeakSet[subprocess.Popen]" = weakref.WeakSet()
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_STATUS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hangup"}


def parent_death_signal(signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send ``signum`` to the child when this process
    dies (Linux ``PR_SET_PDEATHSIG``; None elsewhere). Only for a process with no other
    thread (``preexec_fn`` runs between fork and exec): every caller is a launcher's main
    thread. A parent that died before the call is caught by the ``getppid`` check."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def bind() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)
    return bind


def start(cmd: list[str], **popen_kw: Any) -> subprocess.Popen:
    """Popen ``cmd`` (one of ours: it calls accept_sigint() once it can take a Ctrl-C)
    with SIGINT blocked, SIGHUP when this process dies, and remembered for
    :func:`forward`. A Ctrl-C on the terminal reaches the whole process group; one that
    lands while the child's interpreter starts and imports would kill it with a traceback.
    Blocked, it stays pending (the mask survives exec, and Python leaves it as it finds it)
    and is taken where the child handles it."""
    popen_kw.setdefault("preexec_fn", parent_death_signal(signal.SIGHUP))
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        child = subprocess.Popen(cmd, **popen_kw)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    _children.add(child)
    return child


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP taken as a Ctrl-C is (every clean-up that handles
    KeyboardInterrupt runs), with its signal kept for the status and the exit code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def forward(signum: int) -> None:
    """Send ``signum`` to every child :func:`start` started that still runs."""
    for child in list(_children):
        if child.poll() is None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass


def stop_like_ctrl_c() -> None:
    """From here on SIGTERM and SIGHUP stop this command as a Ctrl-C does, after passing
    the signal on to its children (a ``kill`` reaches one process); and the first SIGINT
    is passed on too before it stops this command: a terminal's Ctrl-C reaches them all
    by itself, but a ``kill -INT`` of this process alone would leave them running (the load
    went on to its end, the server until a timeout). Our children take a second SIGINT as
    they take the first. Main thread only."""
    passed_on: list[bool] = []

    def handle(signum: int, _frame: object) -> None:
        forward(signum)
        raise Stopped(signum)

    def handle_sigint(_signum: int, _frame: object) -> None:
        if not passed_on:
            passed_on.append(True)
            forward(signal.SIGINT)
        raise KeyboardInterrupt
    for s in STOP_SIGNALS:
        signal.signal(s, handle)
    signal.signal(signal.SIGINT, handle_sigint)


def signal_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt (SIGINT unless it is a :class:`Stopped`)."""
    return exc.signum if isinstance(exc, Stopped) else signal.SIGINT


def shell_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128+N when signal N killed it
    (Popen's returncode is then -N)."""
    return 128 - returncode if returncode < 0 else returncode


def stop_status(signum: int) -> str:
    """How a run or a load stopped by ``signum`` is labelled (run.json, bench.json)."""
    return _STATUS.get(signum, f"signal-{signum}")


def accept_sigint() -> None:
    """From here on a Ctrl-C (one pending from start-up included) is delivered."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def fork_available() -> bool:
    """Whether a forked child can take work here (not on Windows, nor where Python has no
    fork start method)."""
    return sys.platform != "win32" and "fork" in mp.get_all_start_methods()
