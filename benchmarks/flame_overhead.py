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
    """observer_effect.py's rounds (rotating, alternately reversed order), with the deltas of
    the --flame variants against both the bare server and omnitrace without --flame (what
    --flame adds)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import numpy as np
    import observer_effect as oe
    variants = ["bare", "omnitrace", "flame-nb", "flame-b"]
    ns = argparse.Namespace(concurrency=32, num_prompts=args.num_prompts, input_len=2500,
                            output_len=args.output_len, seed=0, serve="")
    server, otlp_port, _ = oe._receiver()
    results: dict[str, list[dict]] = {v: [] for v in variants}
    try:
        with tempfile.TemporaryDirectory(prefix="flame-observer-") as work:
            for rnd in range(args.rounds):
                order = variants[rnd % 4:] + variants[:rnd % 4]
                for v in (order[::-1] if rnd % 2 else order):
                    r = oe.run_one(v, ns, work, otlp_port)
                    results[v].append(r)
                    print(f"round {rnd + 1} {v:<10} {r['throughput']:6.2f} req/s  TTFP p50 "
                          f"{np.percentile(r['ttfp'], 50):7.1f} ms", file=sys.stderr, flush=True)
    finally:
        server.stop(0)
    rng = np.random.default_rng(0)
    fmt = lambda d: f"{d[0] * 100:+.1f}% [{d[1] * 100:+.1f}, {d[2] * 100:+.1f}]"  # noqa: E731
    lines = [f"c=32, {args.num_prompts} measured requests, 2500 in / {args.output_len} out, "
             f"{args.rounds} rounds; deltas: mean over rounds of the paired ratio, 95% bootstrap CI",
             "", "| variant | req/s (median) | TTFP p50 ms (median) | vs | Δ throughput | Δ TTFP p50 | Δ TTFP p99 |",
             "|---|---|---|---|---|---|---|"]
    for v in variants:
        rs = results[v]
        med_tp = float(np.median([r["throughput"] for r in rs]))
        med_p50 = float(np.median([np.percentile(r["ttfp"], 50) for r in rs]))
        bases = [b for b in ("bare", "omnitrace") if b != v and not (v == "omnitrace" and b == "omnitrace")]
        if v == "bare":
            lines.append(f"| bare | {med_tp:.2f} | {med_p50:.0f} | | | | |")
            continue
        for b in bases:
            if v == "omnitrace" and b != "bare":
                continue
            pairs = list(zip(rs, results[b]))
            d_tp = oe._ci(pairs, oe._throughput, rng)
            d_50 = oe._ci(pairs, oe._pct("ttfp", 50), rng)
            d_99 = oe._ci(pairs, oe._pct("ttfp", 99), rng)
            lines.append(f"| {v} | {med_tp:.2f} | {med_p50:.0f} | {b} | {fmt(d_tp)} | {fmt(d_50)} | {fmt(d_99)} |")
    return "\n".join(lines)


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
    rid = next(r["id"] for r in bench["requests"] if not r.get("warmup"))
    timings = {}
    for label, sel in (("list", []), ("thinker snapshot", ["--stage", "thinker", "--category", "snapshot"]),
                       ("thinker fifo_blocked sender", ["--stage", "thinker", "--category", "fifo_blocked",
                                                        "--thread", "sender"]),
                       ("talker compute", ["--stage", "talker", "--category", "compute"]),
                       ("thinker compute, one request", ["--stage", "thinker", "--category", "compute",
                                                         "--request", rid]),
                       ("thinker snapshot, one request", ["--stage", "thinker", "--category", "snapshot",
                                                          "--request", rid])):
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "omnitrace", "flame", run_dir, *sel, "--json",
                            "-o", os.path.join(work, "sel")], capture_output=True, text=True)
        timings[label] = {"s": round(time.monotonic() - t, 2), "rc": r.returncode}
        if r.returncode == 0 and sel:
            doc = json.loads(r.stdout)
            # the seconds from the samples against the spans' own covered time
            timings[label].update(samples=doc["samples"], seconds=doc["sampled_s"], interval_s=doc["interval_s"],
                                  ratio=round(doc["sampled_s"] / doc["interval_s"], 4) if doc["interval_s"] else None,
                                  top=doc["top"][:3])
        elif r.returncode == 0:
            doc = json.loads(r.stdout)
            timings[label]["rounds_known"] = {x["name"]: x.get("rounds_known") for x in doc["profiles"]}
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
