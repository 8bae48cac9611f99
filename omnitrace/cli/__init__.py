"""`omnitrace` command line: `omnitrace NAME ARGS` runs ``omnitrace.cli.NAME.main(ARGS)``;
each command module parses its arguments and calls the feature's own modules."""
from __future__ import annotations

import importlib
import sys

from omnitrace import console

# command -> one-line help; its module is omnitrace.cli.<command>, with `main(argv) -> int`
COMMANDS = {
    "loadtest": "serve, load, stop, report in one command; --ab compares two deployments",
    "run": "run a command (or `serve`) with every Python process instrumented",
    "serve": "start the reference pipeline server without instrumentation",
    "agent": "the agent process (started by `omnitrace run`)",
    "bench": "load-test a /v1/chat/completions stream",
    "report": "per-stage TTFP attribution of a run directory",
    "compare": "A/B comparison of runs with confidence intervals",
    "flame": "flame graphs of a --flame run, per stage or linked to spans",
    "export": "a run's spans as OTLP, its tables as Parquet, its timeline as a Perfetto trace",
    "sql": "ask a run your own question: SQL over its typed tables",
    "top": "the load test live in a terminal: rates, TTFP, attribution, FIFOs",
    "hooks": "which hooks the installed vLLM-Omni (and a deploy file's path) will see",
}


def _usage() -> str:
    lines = ["usage: omnitrace COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, help_ in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a mistake, not a request for help: usage on stderr, exit 2
        console.text(_usage())
        return 2
    if argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from omnitrace import __version__
        print(f"omnitrace {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        console.text(f"omnitrace: unknown command {name!r}\n\n{_usage()}")
        return 2
    try:
        # started by another omnitrace command, a Ctrl-C may be pending since start-up
        # (childproc.start): taken here, where it is one line, not a traceback
        from omnitrace.childproc import accept_sigint
        accept_sigint()
        module = importlib.import_module(f"omnitrace.cli.{name}")
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:  # Ctrl-C before the command took charge of it (e.g. while
        # importing, seconds on a loaded machine) or one it leaves to us: no traceback
        console.say(name, "interrupted")
        return 130
    except BrokenPipeError:  # `omnitrace report RUN | head`: the reader left, not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
