"""The agent is lossless when assembly is slower than the event rate: rings are drained
raw into the spool (events.bin) and assembled afterwards, so a burst faster than
assembly drops nothing (the old in-loop assembly dropped ~a third here)."""
from __future__ import annotations

import os
import sys

from tests.agent_util import omnitrace_run, read_json

BURST = r'''
import sys, time
from omnitrace import record
from omnitrace.conventions import Ev
record.set_process_info(role="stage", stage=0)
rec = record.thread_ring().record
rate, total = float(sys.argv[1]), int(sys.argv[2])
t0 = time.perf_counter(); n = r = 0
P = (Ev.SNAPSHOT_BEGIN, Ev.SNAPSHOT_END, Ev.FIFO_ENQUEUE, Ev.FIFO_DEQUEUE,
     Ev.PROCESS_BEGIN, Ev.PROCESS_END, Ev.PUT_BEGIN, Ev.PUT_END)
C = (Ev.GET_BEGIN, Ev.GET_END, Ev.CHUNK_READY, Ev.CHUNK_SCHEDULED)
while n < total:
    q = f"burst-{r}"; r += 1
    for c in range(8):
        for k in P:
            rec(k, q, 0, c, 1024, 1)
        for k in C:
            rec(k, q, 1, c, 1024, 0)
        n += 12
    while n > rate * (time.perf_counter() - t0):  # hold the rate
        time.sleep(0.001)
'''


def test_burst_faster_than_assembly_is_not_dropped(tmp_path):
    run_dir = tmp_path / "run"
    total = 360_000  # 1.2 s at 300k events/s into a 64k-slot ring (~0.2 s of headroom)
    res = omnitrace_run(["--run-dir", str(run_dir), "--ring-records", "65536", "--",
                         sys.executable, "-c", BURST, "300000", str(total)], timeout=300)
    assert res.returncode == 0, res.stderr
    agent = read_json(str(run_dir), "agent.json")
    assert agent["events_dropped"] == 0, agent["rings"]
    assert agent["events_read"] == total
    assert agent["spool"]["backlog_bytes"] == 0 and agent["spool"]["bytes_written"] > 0
    assert agent["spans_built"] == total // 12 * 7
    assert not os.path.exists(run_dir / "events.bin")  # removed once assembled
