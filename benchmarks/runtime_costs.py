"""The reference runtime's own costs, measured side by side in one run.

1. Request snapshot on a 2,500-token request (+450 output tokens): ``recursive`` (the
   element-by-element walk vLLM-Omni had before the fix) vs ``copy`` (flat list copies).
2. Shared-memory chunk put+get (the runtime's connector, producer then consumer) for 4 KB,
   64 KB, 1 MB and 20 MB payloads, per-chunk segments (vLLM-Omni's way) and the segment
   pool, as a ratio to a plain memcpy into an existing shared-memory segment
   (``shm.buf[:n] = payload``) measured in the same run.

Bandwidth = payload bytes / (put + get seconds); best (min) and median of repeated passes.
Usage: ``python benchmarks/runtime_costs.py [--json OUT] [--quick]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from multiprocessing import shared_memory

import numpy as np

from omnitrace.runtime.shm import ChunkMeta, ShmConnector, chunk_key
from omnitrace.runtime.snapshot import Request, snapshot_copy, snapshot_recursive

SIZES = [("4 KB", 4 << 10), ("64 KB", 64 << 10), ("1 MB", 1 << 20), ("20 MB", 20 << 20)]


def _times(fn, n: int, passes: int = 5) -> tuple[float, float]:
    """(min, median) seconds per call over ``passes`` timed loops of ``n`` calls."""
    per = []
    for _ in range(passes):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n)
    return min(per), statistics.median(per)


def bench_snapshot(quick: bool) -> dict:
    rng = np.random.default_rng(1234)
    req = Request("bench", rng.integers(0, 151_000, 2500).tolist(),
                  {"upstream_chunks": [1] * 100, "speaker": "default"})
    req.output_token_ids = rng.integers(0, 151_000, 450).tolist()
    assert snapshot_recursive(req).prompt_token_ids == req.prompt_token_ids
    n_rec, n_copy = (300, 3000) if quick else (2000, 20000)
    rec = _times(lambda: snapshot_recursive(req), n_rec)
    cp = _times(lambda: snapshot_copy(req), n_copy)
    return {"prompt_tokens": 2500, "output_tokens": 450,
            "recursive_us": [rec[0] * 1e6, rec[1] * 1e6], "copy_us": [cp[0] * 1e6, cp[1] * 1e6],
            "ratio_min": rec[0] / cp[0]}


def _memcpy(nbytes: int, payload: np.ndarray, reps: int) -> tuple[float, float]:
    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    src = memoryview(payload).cast("B")
    try:
        shm.buf[:nbytes] = src  # touch every page once, as a long-lived segment would be
        return _times(lambda: shm.buf.__setitem__(slice(0, nbytes), src), reps)
    finally:
        src.release()
        shm.close()
        shm.unlink()


def _put_get(mode: str, nbytes: int, payload: np.ndarray, reps: int,
             copy_out: bool = False) -> tuple[float, float]:
    prod = ShmConnector(0, mode, f"ortbench{os.getpid()}")
    cons = ShmConnector(1, mode, f"ortbenchc{os.getpid()}")
    rid, i = f"ortbench{os.getpid()}", [0]

    def once() -> None:
        key = chunk_key(rid, 0, i[0])
        i[0] += 1
        prod.put(rid, key, ChunkMeta(i[0]), payload)
        got = cons.get(key)
        assert got is not None and got[2] == nbytes
        if copy_out:  # the consumer wants its own copy (what per-chunk get always makes)
            np.array(got[1])
        cons.release(key)
    try:
        once()  # pool: create the slot; per-chunk: nothing to warm (that is the point)
        return _times(once, reps)
    finally:
        prod.close()
        cons.close()


def bench_shm(quick: bool) -> list[dict]:
    rows = []
    for label, n in SIZES:
        payload = np.full(n, 7, dtype=np.uint8)
        reps = max(3, min(20000, (64 << 20) // n)) // (10 if quick else 1)
        reps = max(reps, 3)
        mem = _memcpy(n, payload, reps * 4)
        row = {"size": label, "bytes": n, "memcpy_GBps": n / mem[0] / 1e9}
        for mode, copy_out in (("per-chunk", False), ("pool", False), ("pool+copy", True)):
            best, med = _put_get(mode.split("+")[0], n, payload, reps, copy_out)
            row[mode] = {"us": [best * 1e6, med * 1e6], "GBps": n / best / 1e9,
                         "pct_of_memcpy": 100.0 * mem[0] / best}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke test)")
    args = ap.parse_args(argv)
    snap = bench_snapshot(args.quick)
    print("snapshot of a 2,500-token request (+450 output tokens), us per call, min / median")
    print(f"  recursive  {snap['recursive_us'][0]:8.1f} / {snap['recursive_us'][1]:8.1f}")
    print(f"  copy       {snap['copy_us'][0]:8.1f} / {snap['copy_us'][1]:8.1f}")
    print(f"  recursive / copy = {snap['ratio_min']:.1f}x")
    rows = bench_shm(args.quick)
    print("\nchunk put+get through the shm connector vs memcpy into shared memory (same run)")
    print("  (pool: consumer reads the slot in place; pool+copy: consumer also copies it out)")
    head = f"  {'payload':>7} {'memcpy GB/s':>11}"
    for m in ("per-chunk", "pool", "pool+copy"):
        head += f" | {m + ' us':>14} {'GB/s':>6} {'%memcpy':>7}"
    print(head)
    for r in rows:
        line = f"  {r['size']:>7} {r['memcpy_GBps']:11.2f}"
        for m in ("per-chunk", "pool", "pool+copy"):
            x = r[m]
            line += f" | {x['us'][0]:14.1f} {x['GBps']:6.2f} {x['pct_of_memcpy']:6.1f}%"
        print(line)
    big = rows[-1]
    ok = big["pool"]["pct_of_memcpy"] >= 40.0
    print(f"\ntarget: 20 MB put+get with reused segments >= 40% of memcpy: "
          f"{big['pool']['pct_of_memcpy']:.1f}% ({'met' if ok else 'NOT met'}); "
          f"with a consumer copy-out: {big['pool+copy']['pct_of_memcpy']:.1f}%; "
          f"per-chunk segments: {big['per-chunk']['pct_of_memcpy']:.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"snapshot": snap, "shm": rows, "target_met": ok}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
