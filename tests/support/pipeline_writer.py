"""A small real multi-process event writer for the agent tests (not a mock: it calls
omnitrace.record in real processes, threads and rings, as the runtime's hook sites do).

    python tests/support/pipeline_writer.py OUT.json --requests 4 --chunks 3 [--hold-stage0 S]
        [--kill-marker PATH] [--put-sleep-ms 1]

Main process = API server (stage -1); it runs stage 0 (producer: scheduler thread ->
FIFO -> sender thread, one FIFO shared by all requests) and then stage 1 (consumer) as
child processes, and writes every stamp it recorded to OUT.json (per process files
OUT.json.stage0 / .stage1) so tests can compare spans with the exact stamps.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

from omnitrace import record
from omnitrace.conventions import Ev

now = time.perf_counter_ns


def stage0(args: argparse.Namespace, reqs: list[str]) -> dict:
    record.set_process_info(role="stage", stage=0, replica=0, name="thinker")
    stamps: dict = {"enq": {}, "deq": {}}
    fifo: queue.Queue = queue.Queue()

    def sender() -> None:
        ring = record.thread_ring()
        while True:
            item = fifo.get()
            if item is None:
                return
            req, chunk = item
            t = now()
            ring.record(Ev.FIFO_DEQUEUE, req, 0, chunk, fifo.qsize(), 1, t)
            stamps["deq"][f"{req}/{chunk}"] = t
            ring.record(Ev.PROCESS_BEGIN, req, 0, chunk, 0, 1)
            ring.record(Ev.PROCESS_END, req, 0, chunk, 1000 + chunk, 1)
            ring.record(Ev.PUT_BEGIN, req, 0, chunk, 0, 1)
            time.sleep(args.put_sleep_ms / 1e3)
            ring.record(Ev.PUT_END, req, 0, chunk, 1000 + chunk, 1)

    th = threading.Thread(target=sender, name="sender")
    th.start()
    ring = record.thread_ring()
    for r in reqs:
        ring.record(Ev.STAGE_ADD, r, 0, -1, 0)
        ring.record(Ev.STAGE_SCHEDULE, r, 0, -1, len(reqs))
    for chunk in range(args.chunks):
        for r in reqs:
            ring.record(Ev.SNAPSHOT_BEGIN, r, 0, chunk, 0, 1)
            ring.record(Ev.SNAPSHOT_END, r, 0, chunk, 0, 1)
            t = now()
            ring.record(Ev.FIFO_ENQUEUE, r, 0, chunk, fifo.qsize(), 1, t)
            stamps["enq"][f"{r}/{chunk}"] = t
            fifo.put((r, chunk))
    fifo.put(None)
    th.join()
    if args.self_kill:
        for r in reqs:
            ring.record(Ev.STAGE_EMIT, r, 0, -1, 0, 0)
        os.kill(os.getpid(), 9)  # no FINISH, no clean exit: the ring must survive us
    if args.hold_stage0:
        # leave spans open, tell the test we are ready to be killed, and wait for it
        for r in reqs:
            ring.record(Ev.STAGE_EMIT, r, 0, -1, 0, 0)
        with open(args.kill_marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(args.hold_stage0)
    for r in reqs:
        ring.record(Ev.STAGE_FINISH, r, 0, -1, 0)
    return stamps


def stage1(args: argparse.Namespace, reqs: list[str]) -> dict:
    record.set_process_info(role="stage", stage=1, replica=0, name="talker")
    ring = record.thread_ring()
    for r in reqs:
        ring.record(Ev.STAGE_ADD, r, 1, -1, 0)
        ring.record(Ev.STAGE_SCHEDULE, r, 1, -1, len(reqs))
    for chunk in range(args.chunks):
        for r in reqs:
            ring.record(Ev.GET_BEGIN, r, 1, chunk, 0, 0)
            ring.record(Ev.GET_END, r, 1, chunk, 1000 + chunk, 0)
            ring.record(Ev.CHUNK_READY, r, 1, chunk, 0, 0)
            ring.record(Ev.CHUNK_SCHEDULED, r, 1, chunk, 0, 0)
    for r in reqs:
        ring.record(Ev.STAGE_EMIT, r, 1, -1, 0, 1)
        ring.record(Ev.STAGE_FINISH, r, 1, -1, 0)
    return {}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--chunks", type=int, default=3)
    p.add_argument("--role", default="api")
    p.add_argument("--put-sleep-ms", type=float, default=1.0)
    p.add_argument("--hold-stage0", type=float, default=0.0)
    p.add_argument("--kill-marker", default="")
    p.add_argument("--prefix", default="req")
    p.add_argument("--self-kill", action="store_true",
                   help="stage 0 SIGKILLs itself right after its last records")
    args = p.parse_args()
    reqs = [f"{args.prefix}-{i}" for i in range(args.requests)]
    if args.role in ("stage0", "stage1"):
        stamps = (stage0 if args.role == "stage0" else stage1)(args, reqs)
        with open(f"{args.out}.{args.role}", "w") as f:
            json.dump(stamps, f)
        return 0
    t_start = now()
    record.set_process_info(role="api", stage=-1, replica=0, name="api")
    ring = record.thread_ring()
    for r in reqs:
        ring.record(Ev.REQUEST_ARRIVE, r, -1, -1, 100, 50)
        ring.record(Ev.REQUEST_DISPATCH, r, -1)
    base = [sys.executable, __file__, args.out, "--requests", str(args.requests),
            "--chunks", str(args.chunks), "--put-sleep-ms", str(args.put_sleep_ms),
            "--prefix", args.prefix]
    extra = ["--hold-stage0", str(args.hold_stage0), "--kill-marker", args.kill_marker]
    if args.self_kill:
        extra.append("--self-kill")
    rc0 = subprocess.call(base + ["--role", "stage0"] + extra)
    rc1 = subprocess.call(base + ["--role", "stage1"])
    for r in reqs:
        ring.record(Ev.REQUEST_FIRST_TEXT, r, -1)
        ring.record(Ev.REQUEST_FIRST_AUDIO, r, -1)
        ring.record(Ev.REQUEST_END, r, -1, -1, 0, 1234)
    with open(args.out, "w") as f:
        json.dump({"requests": reqs, "rc": [rc0, rc1], "elapsed_ns": now() - t_start}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
