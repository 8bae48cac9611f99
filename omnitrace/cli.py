"""`omnitrace` command line: each subcommand lives in the module that owns the feature."""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv) -> int`, one-line help)
COMMANDS = {
    "loadtest": ("omnitrace.loadtest", "serve, load, stop, report in one command; --ab compares two deployments"),
    "run": ("omnitrace.inject.run_command", "run a command (or `serve`) with every Python process instrumented"),
    "serve": ("omnitrace.runtime.serve", "start the reference pipeline server without instrumentation"),
    "agent": ("omnitrace.agent.main", "the agent process (started by `omnitrace run`)"),
    "bench": ("omnitrace.bench.cli", "load-test a /v1/chat/completions stream"),
    "report": ("omnitrace.analyze.report_cli", "per-stage TTFP attribution of a run directory"),
    "compare": ("omnitrace.analyze.compare_cli", "A/B comparison of runs with confidence intervals"),
    "flame": ("omnitrace.flame_cli", "flame graphs of a --flame run, per stage or linked to spans"),
    "export": ("omnitrace.export_cli", "every span of a run as OTLP/JSON lines or to an OTLP endpoint"),
    "top": ("omnitrace.top.cli", "the load test live in a terminal: rates, TTFP, attribution, FIFOs"),
}


def _usage() -> str:
    lines = ["usage: omnitrace COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a mistake, not a request for help: usage on stderr, exit 2
        print(_usage(), file=sys.stderr)
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
        print(f"omnitrace: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        # started by another omnitrace command, a Ctrl-C may be pending since start-up
        # (childproc.start): taken here, where it is one line, not a traceback
        from omnitrace.childproc import accept_sigint
        accept_sigint()
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:  # Ctrl-C before the command took charge of it (e.g. while
        # importing, seconds on a loaded machine) or one it leaves to us: no traceback
        print(f"omnitrace {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `omnitrace report RUN | head`: the reader left, not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
