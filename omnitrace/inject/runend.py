"""What follows a run's command once it has ended and the agent has drained its last
events: one home for it, run by `omnitrace run` (the launcher) or, when the launcher was
killed, by the agent that outlived it."""
from __future__ import annotations

import os

from omnitrace import console


def after_command(run_dir: str, who: str) -> None:
    """The served processes' /dev/shm leftovers swept (run.json ``shm_leftovers``), then
    the flame graphs written if the run sampled (profiles/: after the agent's last drain,
    which names the processes)."""
    _sweep_leftovers(run_dir, who)
    from omnitrace.profile.config import RAW_DIR
    if os.path.isdir(os.path.join(run_dir, RAW_DIR)):
        from omnitrace.profile.flags import finish
        finish(run_dir, who)


def _sweep_leftovers(run_dir: str, who: str) -> None:
    from omnitrace.inject.leftovers import sweep_run
    removed = sweep_run(run_dir)
    if removed and (removed["wake_dirs"] or removed["chunk_segments"]):
        console.say(who, f"removed what the served processes left in /dev/shm: "
                    f"{len(removed['wake_dirs'])} vLLM-Omni wake director(ies) of exited stages, "
                    f"{len(removed['chunk_segments'])} unread chunk segment(s) (run.json: shm_leftovers)")
    if removed and removed["chunk_segments_kept"]:
        console.say(who, f"{len(removed['chunk_segments_kept'])} unread chunk segment(s) left in "
                    f"/dev/shm: process(es) {', '.join(map(str, removed['alive_pids']))} of the run are "
                    "still alive and may read them (run.json: shm_leftovers)")
