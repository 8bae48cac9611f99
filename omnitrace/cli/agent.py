"""`omnitrace agent` (``python -m omnitrace.cli.agent``): the agent process, started by
`omnitrace run` with stdin and stdout as pipes and ``--config`` (an
:class:`~omnitrace.agent.config.AgentConfig` as JSON). It prints one ``READY {json}`` line
once its exporters are up (or a one-line error and exit status 2), and finishes when it
reads ``exit CODE`` on stdin, when stdin closes (its parent died), or on SIGTERM/SIGINT.
What it does: :mod:`omnitrace.agent.main`.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

import orjson

from omnitrace import console
from omnitrace.agent import export_otlp
from omnitrace.agent.config import AgentConfig
from omnitrace.agent.main import Agent


def _watch_stdin(agent: Agent) -> None:
    for line in sys.stdin:
        parts = line.split()  # "exit RC [STATUS]": STATUS e.g. "interrupted" (Ctrl-C)
        if parts[:1] == ["exit"]:
            try:
                agent.exit_code = int(parts[1])
            except (IndexError, ValueError):
                pass
            if parts[2:3] == ["interrupted"]:
                agent.end_status = "interrupted"
            break
    agent.stop.set()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="omnitrace agent",
                                description="Started by `omnitrace run`; not meant to be run by hand.")
    p.add_argument("--config", required=True, help="AgentConfig as JSON")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = AgentConfig.from_json(args.config)
        agent = Agent(cfg)
        info = agent.start()
    except (OSError, export_otlp.ConfigError, ValueError, TypeError) as exc:
        console.say("agent", f"cannot start: {exc}")
        return 2
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    print("READY " + orjson.dumps(info).decode(), flush=True)
    threading.Thread(target=_watch_stdin, args=(agent,), daemon=True).start()
    try:
        agent.run()
    finally:
        agent.finish(agent.end_status)
    return 0



if __name__ == "__main__":
    sys.exit(main())
