"""`omnitrace agent` (``python -m omnitrace.cli.agent``): the agent process, started by
`omnitrace run` with stdin and stdout as pipes and ``--config`` (an
:class:`~omnitrace.agent.config.AgentConfig` as JSON). It prints one ``READY {json}`` line
once its exporters are up (or a one-line error and exit status 2), then reads lines:

* ``command PID``: the run's command started (its pid);
* ``exit CODE [STATUS]``: the command ended with CODE; STATUS (``interrupted``,
  ``terminated``, ``hangup``: the signal that stopped the run) replaces ``complete``.
  The final drain follows.

If stdin closes without ``exit``, the launcher died (even by SIGKILL): the command, bound to
it, was sent SIGTERM by the kernel (``childproc.parent_death_signal``); the agent records
it while it stops (killing it if it has not ended in ``LAUNCHER_GRACE_S``), then drains,
marks the run ``launcher-killed`` and does what the launcher would have done after the
command (``inject.runend.after_command``). SIGTERM/SIGINT to the agent: finish now.

``--standby``: a spare kept ready beside the running agent (imports done, then ``STANDBY``),
that starts only on ``takeover CONFIG`` (an AgentConfig as JSON, ``takes_over`` set): `omnitrace run` replaces an agent that died with
it in a fraction of the second a cold start takes on a busy machine.
What it does: :mod:`omnitrace.agent.main`.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import orjson

from omnitrace import console
from omnitrace.agent import export_otlp
from omnitrace.agent.collect import pid_alive
from omnitrace.agent.config import AgentConfig
from omnitrace.agent.main import Agent

STOP_STATUSES = ("interrupted", "terminated", "hangup")
LAUNCHER_GRACE_S = 60.0  # a command's own clean stop after its launcher died, at most


def _await_takeover(cfg: AgentConfig) -> AgentConfig | None:
    """A standby's wait, its imports done (they are most of an agent's start): the config
    to take over with, or None when its launcher no longer needs it (stdin closed)."""
    print("STANDBY", flush=True)
    for line in sys.stdin:
        if line.startswith("takeover "):
            return AgentConfig.from_json(line[len("takeover "):])
    return None


def _watch_stdin(agent: Agent) -> None:
    command: int | None = None
    for line in sys.stdin:
        parts = line.split()
        if parts[:1] == ["command"] and parts[1:2] and parts[1].isdigit():
            command = int(parts[1])
        elif parts[:1] == ["exit"]:
            try:
                agent.exit_code = int(parts[1])
            except (IndexError, ValueError):
                pass
            if parts[2:3] and parts[2] in STOP_STATUSES:
                agent.end_status = parts[2]
            agent.stop.set()
            return
    agent.end_status = "launcher-killed"
    console.say("agent", "omnitrace run died; recording the command's stop"
                + (f" (pid {command})" if command else ""))
    if command is not None:
        _await_exit(command)
    agent.stop.set()


def _await_exit(pid: int) -> None:
    """Until ``pid`` (not our child: a pid of the dead launcher's) is gone; killed after
    LAUNCHER_GRACE_S."""
    deadline = time.monotonic() + LAUNCHER_GRACE_S
    while pid_alive(pid):
        if time.monotonic() > deadline:
            console.say("agent", f"the command (pid {pid}) did not stop in {LAUNCHER_GRACE_S:.0f} s "
                        "after its launcher died: killed")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = float("inf")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="omnitrace agent",
                                description="Started by `omnitrace run`; not meant to be run by hand.")
    p.add_argument("--config", required=True, help="AgentConfig as JSON")
    p.add_argument("--standby", action="store_true",
                   help="print STANDBY, then wait for `takeover CONFIG` on stdin (the config to "
                        "start with, takes_over set) before starting; exit if stdin closes")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = AgentConfig.from_json(args.config)
        if args.standby:
            cfg = _await_takeover(cfg)
            if cfg is None:
                return 0
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
    if agent.end_status == "launcher-killed":
        from omnitrace.inject.runend import after_command
        after_command(cfg.run_dir, "agent")
    return 0



if __name__ == "__main__":
    sys.exit(main())
