"""Runs of the worked example with each request's thinker put of chunk 0 (and everything
after it) delayed, recorded as a run records them: what `compare` is tested on
(tests/unit/analyze/test_compare.py, tests/system/analyze/test_compare.py)."""
from __future__ import annotations

from omnitrace.conventions import Ev
from tests.support.event_fixture import three_stage_events, write_event_run


def put_delayed_run(path: str, extra_put_us: float, n: int = 12, bench: dict | None = None) -> str:
    """n worked-example requests, recorded as a run records them; each one's thinker put of
    chunk 0, and everything after it, ``extra_put_us`` (+ a little per-request noise) later."""
    return write_event_run(path, put_delayed_script(extra_put_us, n), bench)


def put_delayed_script(extra_put_us: float, n: int) -> list[tuple]:
    script = []
    for i in range(n):
        events = three_stage_events(f"r{i}", off=i * 2000)
        put_end = next(e[7] for e in events if e[1] == Ev.PUT_END and e[2] == f"r{i}" and e[3] == 0 and e[4] == 0)
        shift = extra_put_us + (i % 3)
        script += [e[:7] + (e[7] + shift,) if e[7] >= put_end else e for e in events]
    return sorted(script, key=lambda e: e[7])
