"""The agent beside `omnitrace run`'s command: started and READY before it, replaced by
a spare kept ready when it dies, told the command's end and waited for through its final
drain; then the rings it did not read to the end are counted into run.json
(:mod:`omnitrace.runner.ringsleft`)."""
from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import time

import orjson

from omnitrace import console
from omnitrace import conventions as cv
from omnitrace.agent.config import AgentConfig
from omnitrace.childproc import python_module
from omnitrace.runfiles import names
from omnitrace.runner.ringsleft import count_rings_left

AGENT_READY_TIMEOUT_S = 60.0


def start_agent(cfg: AgentConfig, lock: int, standby: subprocess.Popen | None = None) -> subprocess.Popen | None:
    """The agent, READY (None: it could not start; it said why). ``standby``: a spare
    (:func:`_spare_agent`) told to take over with ``cfg.takes_over``, cold-started if that
    fails."""
    if standby is not None and standby.poll() is None:
        try:
            assert standby.stdin is not None
            standby.stdin.write(b"takeover " + cfg.to_json().encode() + b"\n")
            standby.stdin.flush()
            return _ready(standby)
        except (BrokenPipeError, OSError):
            pass
    return _ready(_agent_process(cfg, lock))


def _spare_agent(cfg: AgentConfig, lock: int) -> subprocess.Popen:
    """An agent process with its imports done, waiting to take over (``--standby``)."""
    return _agent_process(cfg, lock, "--standby")


def _stop_spare(spare: subprocess.Popen | None) -> None:
    if spare is not None and spare.poll() is None:
        try:
            assert spare.stdin is not None
            spare.stdin.close()  # a standby exits when its launcher closes its stdin
            spare.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            spare.kill()
            spare.wait()


def _agent_process(cfg: AgentConfig, lock: int, *extra: str) -> subprocess.Popen:
    args = python_module("omnitrace.cli.agent", "--config", cfg.to_json(), *extra)
    env = dict(os.environ)
    env.pop(cv.ENV_RUN_ID, None)  # the agent itself is not instrumented
    # own process group: a Ctrl-C on the terminal reaches the command, not the agent, which
    # must stay to do the final drain. Not its own session: that would be its own scheduler
    # autogroup, starved beside a busy server (omnitrace.profile.runner's docstring)
    # the run directory's lock goes with it: held while the agent writes there, even if
    # this process is killed
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                            process_group=0, pass_fds=(lock,))


def _ready(agent: subprocess.Popen) -> subprocess.Popen | None:
    """``agent`` once it says READY (a standby's STANDBY line before is skipped)."""
    line = _first_line_but_standby(agent, time.monotonic() + AGENT_READY_TIMEOUT_S)
    if line is None or not line.startswith(b"READY"):
        if line is None:  # silent and alive: give up on it
            agent.kill()
            console.say("run", "the agent did not start in time")
        try:  # otherwise it closed stdout: it printed its one-line error and is exiting
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        return None
    agent.info = orjson.loads(line[len(b"READY"):])  # type: ignore[attr-defined]
    return agent


def _first_line_but_standby(agent: subprocess.Popen, deadline: float) -> bytes | None:
    """The agent's first stdout line that is not STANDBY (b"" at its end of file; None: none
    by ``deadline``). Read from the descriptor by hand, not with the pipe's buffered
    readline: that reads ahead, so a READY that came in one read with STANDBY (a spare
    told to take over before its imports were done) would sit in the buffer unseen by
    select() until the deadline."""
    assert agent.stdout is not None
    fd, pending = agent.stdout.fileno(), b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if not line.startswith(b"STANDBY"):
                return line
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return pending
        pending += chunk


AGENT_POLL_S = 0.1  # a dead agent is noticed (and replaced) this soon
AGENT_RESTART_WINDOW_S = 60.0  # --agent-restarts counts within this: one that keeps dying is let be


def wait_command(child: subprocess.Popen, agent: subprocess.Popen, cfg: AgentConfig,
                  lock: int, max_restarts: int) -> tuple[int, subprocess.Popen]:
    """The command's exit status, and the agent that is there at its end: one that dies
    meanwhile is replaced at once by one that takes over its rings and event log (only
    what it had read and not yet written, and what the rings dropped while none ran, is
    lost: both counted; run.json ``agent_restarts`` holds each gap's times)."""
    agents = _Agents(agent, cfg, lock, max_restarts)
    try:
        while True:
            try:
                return child.wait(AGENT_POLL_S if agents.agent is not None else None), agents.last
            except subprocess.TimeoutExpired:
                pass
            if agents.agent.poll() is not None and agents.replace() is not None:
                tell_agent(agents.agent, f"command {child.pid}")
    finally:
        _stop_spare(agents.spare)


class _Agents:
    """The running agent, and a spare kept ready to replace it (:func:`_spare_agent`)."""

    def __init__(self, agent: subprocess.Popen, cfg: AgentConfig, lock: int, max_restarts: int) -> None:
        self.agent: subprocess.Popen | None = agent
        self.last = agent  # the latest agent, alive or not (its exit ends the run's record)
        self.cfg, self.lock, self.max_restarts = cfg, lock, max_restarts
        self.spare = _spare_agent(cfg, lock) if max_restarts else None
        self.restarts: list[float] = []

    def replace(self) -> subprocess.Popen | None:
        """The dead agent's successor (None: not replaced; recording stops, said once)."""
        dead, noticed = self.last, time.time_ns()
        how = f"signal {-dead.returncode}" if dead.returncode < 0 else f"exit status {dead.returncode}"
        self.restarts = [t for t in self.restarts if time.monotonic() - t < AGENT_RESTART_WINDOW_S]
        new, at_limit = None, len(self.restarts) >= self.max_restarts
        if not at_limit:
            self.restarts.append(time.monotonic())
            cfg = dataclasses.replace(  # its endpoint where the dead one's was
                self.cfg, prometheus_port=dead.info.get("prometheus_port") or self.cfg.prometheus_port,
                takes_over={"pid": dead.pid, "ended": how, "noticed_unix_ns": noticed,
                            "last_seen_unix_ns": _mtime_ns(names.path(self.cfg.run_dir, names.AGENT))})
            new = start_agent(cfg, self.lock, self.spare)
            if new is not None and new is self.spare:
                self.spare = _spare_agent(self.cfg, self.lock)  # ready for the next one
        self.agent = new
        if new is None:
            console.say("run", f"the agent (pid {dead.pid}) died ({how}) while the command runs"
                        + (", and its successor did not start" if not at_limit else
                           f", after {self.max_restarts} restart(s) in {AGENT_RESTART_WINDOW_S:.0f} s"
                           if self.max_restarts else "")
                        + ": recording stopped; the command goes on; the report will count what "
                        "was not recorded (run.json: status agent-killed)")
            return None
        self.last = new
        console.say("run", f"the agent (pid {dead.pid}) died ({how}); pid {new.pid} took over its "
                    f"rings {(time.time_ns() - noticed) / 1e9:.2f} s later (run.json: agent_restarts)")
        return new


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def tell_agent(agent: subprocess.Popen, line: str) -> None:
    """One line of the agent's stdin protocol (:mod:`omnitrace.cli.agent`)."""
    try:
        assert agent.stdin is not None
        agent.stdin.write(f"{line}\n".encode())
        agent.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # a dead agent: wait_command says so


def stop_agent(agent: subprocess.Popen, rc: int, cfg: AgentConfig | None = None,
                status: str | None = None, stall_s: float = 90.0) -> None:
    """Tell the agent to finish (with run.json's ``status`` if not "complete") and wait
    for it: its final drain, at most a few seconds of live views, and its exporters'
    final flush (bounded by --otlp-timeout). The limit is on *no progress* (agent.json
    unchanged for ``stall_s``), after which it is killed."""
    try:
        assert agent.stdin is not None
        agent.stdin.write(f"exit {rc}{' ' + status if status else ''}\n".encode())
        agent.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    progress = names.path(cfg.run_dir, names.AGENT) if cfg is not None else None
    last_mark: tuple | None = None
    last_change = time.monotonic()
    while True:
        try:
            agent.wait(1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        try:
            st = os.stat(progress) if progress else None
            mark = (st.st_mtime_ns, st.st_size) if st else None
        except OSError:
            mark = None
        if mark is not None and mark != last_mark:
            last_mark, last_change = mark, now
        elif now - last_change > stall_s:
            agent.kill()
            agent.wait()
            console.say("run", f"the agent made no progress for {stall_s:.0f} s during its "
                        "final flush and was killed")
            break
    if cfg is not None:
        count_rings_left(cfg.run_dir, cfg.run_id, rc, agent.returncode)
