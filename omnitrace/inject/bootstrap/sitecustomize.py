"""omnitrace bootstrap, put first on PYTHONPATH by `omnitrace run`.

Python imports ``sitecustomize`` at start-up in every interpreter, and children inherit
PYTHONPATH, so every Python process the command spawns comes through here. It must
never break the host process: any failure is one warning line and the process runs on,
uninstrumented.
"""


def _chain_next_sitecustomize() -> None:
    # Another sitecustomize later on sys.path (a venv's, a distro's) would be shadowed
    # by this one: find it and run it, as if it had been imported under its own name.
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _instrument() -> None:
    import os

    if not os.environ.get("OMNITRACE_RUN_ID"):
        return
    from omnitrace import record

    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        # "python [-P] -m pkg.mod" (or childproc's 3.10 form) -> "pkg.mod";
        # "python script.py" / "vllm" -> its base name
        from omnitrace.childproc import module_of
        name = module_of(argv) or os.path.basename(
            argv[1] if len(argv) > 1 and argv[0].startswith(("python", "/")) and
            argv[1].endswith(".py") else argv[0])
    except (OSError, ValueError, IndexError):
        name = ""
    record.set_process_info(name=name[:64])
    if os.environ.get("OMNITRACE_FLAME"):  # --flame: a clock for py-spy, or pyinstrument
        from omnitrace.profile import inproc
        inproc.start()
    try:
        from omnitrace.inject import patching
    except ImportError:
        return
    patching.apply()


def _warn(what: str, exc: BaseException) -> None:
    import sys

    try:
        sys.stderr.write(f"omnitrace: warning: bootstrap {what} failed, continuing "
                         f"uninstrumented: {type(exc).__name__}: {exc}\n")
    except Exception:
        pass


try:
    _chain_next_sitecustomize()
except Exception as _exc:  # the other sitecustomize's failure is reported, not fatal
    _warn("chaining to the next sitecustomize", _exc)
try:
    _instrument()
except Exception as _exc:
    _warn("instrumentation", _exc)
