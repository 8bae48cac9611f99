"""What `--flame` costs and how big its profiles get.

1. Observer effect: ``benchmarks/observer_effect.py`` with the variants bare, omnitrace,
   flame-nb (``--flame`` nonblocking, the default) and flame-b (``--flame-mode blocking``)
   at c=32: throughput and TTFP deltas against the uninstrumented server, with 95% CIs.
2. A long run under load (``--minutes``, c=32, recursive snapshots): the size of
   ``profiles/`` per minute, the finalize time, and how long `omnitrace flame` takes to
   answer span-linked selections on it.

    python benchmarks/flame_overhead.py --rounds 3 --minutes 10 [--skip-observer] [--skip-long]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}


def observer(args: argparse.Namespace) -> str:
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "observer_effect.py"),
           "--variants", "bare,omnitrace,flame-nb,flame-b", "--rounds", str(args.rounds),
           "--concurrency", "32", "--num-prompts", str(args.num_prompts), "--input-len", "2500",
           "--output-len", str(args.output_len)]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode != 0:
        raise SystemExit(f"observer_effect.py failed ({r.returncode})")
    return r.stdout


def _du(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def long_run(args: argparse.Namespace) -> dict:
    work = tempfile.mkdtemp(prefix="flame-long-")
    run_dir = os.path.join(work, "run")
    # ~3.5 req/s at c=32 with 2,500 in / 200 out on 2 cores: enough prompts for the minutes
    prompts = int(args.minutes * 60 * args.req_per_s)
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", run_dir, "--flame", "--",
           sys.executable, "-m", "omnitrace.bench.serve_and_bench", "--serve", "--snapshot recursive --shm pool",
           "--", "--no-progress", "--concurrency", "32", "--num-prompts", str(prompts), "--warmup", "32",
           "--input-len", "2500", "--output-len", "200"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    peak_raw = 0
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:  # the raw chunks on disk while py-spy rotates
        peak_raw = max(peak_raw, _du(os.path.join(run_dir, "profiles", "raw")))
        time.sleep(2.0)
    err = proc.stderr.read() if proc.stderr else ""
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"long run failed ({proc.returncode}):\n{err[-3000:]}")
    with open(os.path.join(run_dir, "bench.json")) as f:
        bench = json.load(f)
    win = bench["levels"][0]["measured_window"]
    minutes = (int(win["end_unix_ns"]) - int(win["start_unix_ns"])) / 60e9
    with open(os.path.join(run_dir, "run.json")) as f:
        rj = json.load(f)
    run_minutes = (int(rj["ended_unix_ns"]) - int(rj["started_unix_ns"])) / 60e9
    pdir = os.path.join(run_dir, "profiles")
    sizes = {n: os.path.getsize(os.path.join(pdir, n)) for n in sorted(os.listdir(pdir))}
    timings = {}
    for label, sel in (("list", []), ("thinker snapshot", ["--stage", "thinker", "--category", "snapshot"]),
                       ("thinker fifo_blocked sender", ["--stage", "thinker", "--category", "fifo_blocked",
                                                        "--thread", "sender"]),
                       ("talker compute", ["--stage", "talker", "--category", "compute"])):
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "omnitrace", "flame", run_dir, *sel, "--json",
                            "-o", os.path.join(work, "sel")], capture_output=True, text=True)
        timings[label] = {"s": round(time.monotonic() - t, 2), "rc": r.returncode}
        if r.returncode == 0 and sel:
            doc = json.loads(r.stdout)
            timings[label].update(samples=doc["samples"], top=doc["top"][:3])
    finalize_line = next((ln for ln in err.splitlines() if "flame graphs in" in ln), "")
    out = {"wall_s": round(wall, 1), "run_minutes": round(run_minutes, 2), "measured_minutes": round(minutes, 2),
           "requests": len(bench["requests"]), "profiles_bytes": sum(sizes.values()), "files": sizes,
           "profiles_mb_per_run_minute": round(sum(sizes.values()) / 1e6 / run_minutes, 3),
           "peak_raw_bytes": peak_raw, "events_bytes": _du(os.path.join(run_dir, "events")),
           "flame": timings, "finalize": finalize_line}
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        out["run_dir"] = run_dir
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--output-len", type=int, default=200)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--req-per-s", type=float, default=3.5, help="to size the long run's prompts")
    p.add_argument("--skip-observer", action="store_true")
    p.add_argument("--skip-long", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the long run's directory")
    args = p.parse_args()
    if not args.skip_long:
        print(json.dumps(long_run(args), indent=2))
    if not args.skip_observer:
        print(observer(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
