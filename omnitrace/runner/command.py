"""`omnitrace run`'s command beside its agent: the environment that instruments every
Python process it spawns (the bootstrap first on PYTHONPATH, the run id, the hook
directories), the agent started first and stopped last, the rings and /dev/shm swept
after, and one line on how it ended."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field

from omnitrace import childproc, console
from omnitrace import conventions as cv
from omnitrace.agent.config import AgentConfig
from omnitrace.profile.config import FlameConfig
from omnitrace.runner.agents import start_agent, stop_agent, tell_agent, wait_command
from omnitrace.runner.signals import StopSignals

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "inject",
                             "bootstrap")


@dataclass(frozen=True)
class Command:
    """What `omnitrace run` was asked to run, validated."""
    argv: list[str]
    extra_env: dict[str, str] = field(default_factory=dict)
    flame: FlameConfig | None = None  # --flame's
    ring_records: int | None = None
    patches: tuple[str, ...] = ()  # the user's --patches directories
    agent_restarts: int = 5


def command_env(cfg: AgentConfig, cmd: Command) -> dict[str, str]:
    """The command's environment: recording on, the bootstrap first on PYTHONPATH, the
    user's hook dirs before any already set, a user's VLLM_PLUGINS keeping ours."""
    from omnitrace.inject.patching import ENV_PATCHES
    from omnitrace.inject.vllm_plugin import plugin_env

    env = dict(os.environ)
    env.update(cmd.extra_env)
    env[cv.ENV_RUN_ID] = cfg.run_id
    env[cv.ENV_RUN_DIR] = cfg.run_dir
    if cmd.ring_records is not None:
        env[cv.ENV_RING_RECORDS] = str(cmd.ring_records)
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if cmd.patches:
        env[ENV_PATCHES] = os.pathsep.join([os.path.abspath(d) for d in cmd.patches] +
                                           [p for p in env.get(ENV_PATCHES, "").split(os.pathsep) if p])
    env.update(plugin_env(env))
    return env


def run_with_agent(cfg: AgentConfig, lock: int, cmd: Command, sigs: StopSignals) -> int:
    """The command run and recorded; its exit status as a shell reports it (2: the agent
    did not start; 126/127: the command could not)."""
    agent = start_agent(cfg, lock)
    if agent is None:
        return 2
    if sigs.got:  # Ctrl-C while the agent started: the command never starts
        stop_agent(agent, 128 + sigs.got[0], cfg, childproc.stop_status(sigs.got[0]))
        console.say("run", f"interrupted before the command started; {cfg.run_dir} holds "
                    "an empty run")
        return 128 + sigs.got[0]
    console.say("run", f"run {cfg.run_id} -> {cfg.run_dir}")
    try:
        child = _start_command(cmd, command_env(cfg, cmd))
    except OSError as exc:
        console.say("run", f"{cmd.argv[0]}: {exc.strerror}")
        rc = 127 if isinstance(exc, FileNotFoundError) else 126
        stop_agent(agent, rc, cfg)
        return rc
    sigs.attach(child)
    tell_agent(agent, f"command {child.pid}")  # killed, this launcher leaves it to the agent
    rc, agent = wait_command(child, agent, cfg, lock, cmd.agent_restarts)
    rc = childproc.shell_status(rc)
    stop_agent(agent, rc, cfg, sigs.status())
    from omnitrace.inject.runend import after_command
    after_command(cfg.run_dir, "run")
    _say_end(cfg.run_dir, rc, sigs.status())
    return rc


def _start_command(cmd: Command, env: dict[str, str]) -> subprocess.Popen:
    from omnitrace.profile import flags as flame_flags
    # our own server takes a Ctrl-C once its handlers are in (childproc.start); anything
    # else gets it as from the terminal
    ours = childproc.module_of(cmd.argv) == "omnitrace.cli.serve"
    # --flame: the profile runner starts the command under py-spy
    popen = childproc.start if ours and cmd.flame is None else subprocess.Popen
    # killed, this launcher takes the command with it (SIGTERM: its own clean stop)
    return popen(flame_flags.wrap(cmd.flame, cmd.argv), env=env,
                 preexec_fn=childproc.parent_death_signal(signal.SIGTERM))


def _say_end(run_dir: str, rc: int, stopped_by: str | None) -> None:
    if stopped_by:
        console.say("run", f"{stopped_by}; what was recorded is in {run_dir} "
                    f"(`omnitrace report {run_dir}`)")
    elif rc == 0:
        console.say("run", f"done; see `omnitrace report {run_dir}`")
    else:
        console.say("run", f"the command failed (exit status {rc}); what it recorded is in "
                    f"{run_dir} (`omnitrace report {run_dir}`)")
