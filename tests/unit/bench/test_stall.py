"""The bench's stall watch (omnitrace.bench.stall) on hand-written agent records: which
stage it names when requests stop progressing. The bench against real servers:
tests/system/bench/test_bench.py."""
from __future__ import annotations

import json
import os


from omnitrace.bench.stall import StallWatch
def test_stall_watch_names_the_stage_quiet_longest(tmp_path):
    """One line when nothing has progressed for the threshold with requests in flight,
    naming the stage whose rings stopped growing first; one line when requests move again;
    nothing while no request is in flight."""
    now, said = [100.0], []

    def agent(*written: int) -> None:
        rings = [{"role": "stage", "stage": i, "pid": os.getpid(), "events_written": n}
                 for i, n in enumerate(written)] + [{"role": "api", "stage": -1, "events_written": 1}]
        (tmp_path / "agent.json").write_text(json.dumps({"rings": rings}))

    (tmp_path / "processes.jsonl").write_text("".join(
        json.dumps({"role": "stage", "stage": i, "name": n}) + "\n"
        for i, n in enumerate(("thinker", "talker", "code2wav"))))
    watch = StallWatch(10, said.append, str(tmp_path), clock=lambda: now[0])
    for t, written in ((100, (5, 5, 5)), (101, None), (103, (5, 6, 6)), (105, (5, 6, 7)), (110, (5, 6, 7))):
        now[0] = t
        if written is None:
            watch.beat()  # the last stream chunk
            continue
        agent(*written)
        watch.check(4)
    assert said == []  # 9 s without progress: not yet
    now[0] = 111.5
    watch.check(4)
    now[0] = 115
    watch.check(4)
    assert said == ["no request has progressed for 10 s (4 in flight); stage 0:thinker stopped stepping "
                    "first (quiet: 0:thinker 12 s, 1:talker 8 s, 2:code2wav 6 s)"], said
    now[0] = 116
    watch.beat()
    watch.check(4)
    assert said[1:] == ["requests progress again (stalled 15 s)"]
    now[0] = 200
    watch.check(0)
    assert len(said) == 2
