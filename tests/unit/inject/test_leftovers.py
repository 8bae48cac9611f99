"""The report warns of what a served pipeline left in /dev/shm only where a stage died. The
sweep after a run, with real processes: tests/system/inject/test_leftovers.py."""
from __future__ import annotations

import os


def _with_leftovers(d: str, left: dict) -> str:
    import json
    path = os.path.join(d, "run.json")
    with open(path) as f:
        run = json.load(f)
    run["shm_leftovers"] = left
    with open(path, "w") as f:
        json.dump(run, f)
    return d
def test_report_warns_of_leftovers_only_where_a_stage_died(tmp_path) -> None:
    """Issue 41: every real-server report warned "3 stale vLLM-Omni wake director(ies) ...
    (a stage died mid-request?)", though vLLM-Omni leaves one per stage on every clean
    stop. Wake directories alone (run.json still counts them) say nothing; chunk segments
    written and never read, or a stage death in the record, do."""
    from omnitrace.analyze.report import build_report
    from omnitrace.analyze.rundir import load_run
    from omnitrace.conventions import Ev
    from tests.support.event_fixture import three_stage_events, write_event_run
    wake = [f"omni_shm_wake_0_{p}" for p in (101, 102, 103)]

    def warned(name: str, left: dict, script: list) -> list[str]:
        d = _with_leftovers(write_event_run(str(tmp_path / name), script), left)
        return [w for w in build_report(load_run([d]), waterfalls=0)["warnings"] if "/dev/shm" in w]

    clean = three_stage_events("r0")
    assert warned("clean", {"wake_dirs": wake, "chunk_segments": []}, clean) == []
    unread = warned("unread", {"wake_dirs": wake, "chunk_segments": ["chatcmpl-r0-0123abcd_0_3"]}, clean)
    assert len(unread) == 1 and "1 chunk segment(s) never read, 3 vLLM-Omni wake" in unread[0], unread
    died = clean + [(("api", -1, "MainThread"), Ev.STAGE_DIED, "", 1, -1, 0, 0, 2000)]
    said = warned("died", {"wake_dirs": wake, "chunk_segments": []}, died)
    assert len(said) == 1 and "(a stage died mid-request)" in said[0], said
