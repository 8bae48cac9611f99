"""The seed scenario: does the snapshot fix (recursive -> copy) show up where it should?

2,500-token prompts, 900 output tokens, concurrency 32, on the reference pipeline, once
with ``--snapshot recursive`` and once with ``--snapshot copy``, each under
`omnitrace run`; then `omnitrace report` on both. Prints the key numbers: snapshot cost
per chunk per stage (and the recursive/copy ratio), stage-0 FIFO residence p50/p99,
TTFP, and the attribution rows that moved.

    python benchmarks/seed_scenario.py --out /tmp/seed --thinker-step-ms 30   # figures in RESULTS.md
    python benchmarks/seed_scenario.py --out /tmp/seed            # packaged pipeline (5 ms thinker step)
    python benchmarks/seed_scenario.py --output-len 60 --num-prompts 16 --concurrency 8   # scaled down

Heavy on a 2-core machine: the full scenario takes minutes per run. With the packaged 5 ms
thinker step the copy run's thinker outpaces its one sender thread on a busy 2-core machine
and stage-0 FIFO residence is then set by that backlog (see RESULTS.md); a GPU-like 30 ms
step (``--thinker-step-ms 30``) is the regime the snapshot fix is about.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def run_one(out: str, strategy: str, args: argparse.Namespace) -> dict:
    d = os.path.join(out, strategy)
    bench = ["--no-progress", "--concurrency", str(args.concurrency), "--num-prompts", str(args.num_prompts),
             "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--seed", str(args.seed)]
    if args.warmup is not None:
        bench += ["--warmup", str(args.warmup)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", d]
    if args.ring_records:
        cmd += ["--ring-records", str(args.ring_records)]
    cmd += ["--", sys.executable, "-m", "omnitrace.bench.serve_and_bench",
            "--serve", f"--snapshot {strategy} {args.serve_extra}".strip(), "--", *bench]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{strategy} run failed ({r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    t0 = time.perf_counter()
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json", os.path.join(d, "report.json"),
                          "--html", os.path.join(d, "report.html")], capture_output=True, text=True)
    if rep.returncode not in (0, 3):
        raise SystemExit(f"report failed: {rep.stderr[-1500:]}")
    with open(os.path.join(d, "report.json")) as f:
        doc = json.load(f)
    doc["_run_s"], doc["_report_s"] = took, time.perf_counter() - t0
    with open(os.path.join(d, "report.txt"), "w") as f:
        f.write(rep.stdout)
    return doc


def key_numbers(doc: dict) -> dict:
    snap = {s["stage"]: s for s in doc["snapshot"]}
    fifo = {f["stage"]: f for f in doc["fifo"]}
    s0 = next((v for k, v in snap.items() if k.startswith("0")), None)
    f0 = next((v for k, v in fifo.items() if k.startswith("0")), None)
    return {
        "requests": doc["window"]["attributed"], "dropped": doc["recorder"]["dropped"],
        "snapshot_s0_mean_us": s0 and s0["mean_us"], "snapshot_s0_p50_us": s0 and s0["p50_us"],
        "snapshot_s0_chunks": s0 and s0["count"],
        "snapshot_s1_mean_us": next((v["mean_us"] for k, v in snap.items() if k.startswith("1")), None),
        "fifo_s0_p50_ms": f0 and f0["residence_p50_ms"], "fifo_s0_p99_ms": f0 and f0["residence_p99_ms"],
        "fifo_s0_max_ms": f0 and f0["residence_max_ms"], "fifo_s0_depth_max": f0 and f0["depth_max"],
        "ttfp_p50_ms": doc["ttfp"]["server_ms"]["p50"], "ttfp_p99_ms": doc["ttfp"]["server_ms"]["p99"],
        "client_minus_server_median_ms": doc["ttfp"]["client_minus_server_median_ms"],
        "sum_error_max_ns": doc["ttfp"]["sum_error_max_ns"], "run_s": doc["_run_s"], "report_s": doc["_report_s"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="./seed-scenario")
    p.add_argument("--input-len", type=int, default=2500)
    p.add_argument("--output-len", type=int, default=900)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ring-records", type=int, default=1 << 20)
    p.add_argument("--serve-extra", default="", help="more `omnitrace serve` arguments for both runs, e.g. '--shm pool'")
    p.add_argument("--thinker-step-ms", type=float, default=None,
                   help="thinker cost.base_ms (GPU-like step time; default: the packaged pipeline's)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.thinker_step_ms is not None:
        import yaml
        from omnitrace.runtime import config
        cfg = config.to_dict(config.load())
        cfg["stages"][0]["cost"]["base_ms"] = args.thinker_step_ms
        path = os.path.abspath(os.path.join(args.out, "pipeline.yaml"))
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        args.serve_extra = f"{args.serve_extra} --pipeline {path}"
    res = {}
    for strategy in ("recursive", "copy"):
        res[strategy] = key_numbers(run_one(args.out, strategy, args))
        print(strategy, json.dumps(res[strategy]), flush=True)
    r, c = res["recursive"], res["copy"]
    ratio = r["snapshot_s0_mean_us"] / c["snapshot_s0_mean_us"] if c["snapshot_s0_mean_us"] else float("inf")
    summary = {"scenario": vars(args), "recursive": r, "copy": c, "snapshot_s0_ratio": ratio}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"\nsnapshot cost per chunk, stage 0: recursive {r['snapshot_s0_mean_us']:.1f} us vs copy "
          f"{c['snapshot_s0_mean_us']:.1f} us  ({ratio:.1f}x)")
    print(f"stage-0 FIFO residence p99: recursive {r['fifo_s0_p99_ms']:.3f} ms vs copy {c['fifo_s0_p99_ms']:.3f} ms")
    print(f"TTFP p50/p99: recursive {r['ttfp_p50_ms']:.1f}/{r['ttfp_p99_ms']:.1f} ms vs copy "
          f"{c['ttfp_p50_ms']:.1f}/{c['ttfp_p99_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
