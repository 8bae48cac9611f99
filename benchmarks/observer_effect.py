"""How much does omnitrace change what it measures? The same load against the same server,
uninstrumented and instrumented, side by side in one run.

Variants (each a fresh server per round):

* ``bare``       — `omnitrace serve` (the recorder is a no-op without `omnitrace run`);
* ``omnitrace``  — `omnitrace run serve` (rings, agent, event log);
* ``flame-nb`` / ``flame-b`` — `omnitrace run --flame --flame-mode nonblocking|blocking serve`
  (only when `omnitrace run` has ``--flame``);
* ``naive-otel`` — `omnitrace serve` with every hook-site event made an OpenTelemetry SDK
  span in-process (BatchSpanProcessor, OTLP/gRPC to a real receiver that discards):
  ``benchmarks/naive_otel/sitecustomize.py``.

Rounds run the variants in rotating, alternately reversed order (ABBA generalised), so
drift over time (thermal, other jobs) hits every variant alike. Per variant: throughput
(measured requests / measured window), client TTFP and TTFT p50/p99 from bench.json;
deltas against ``bare`` with 95% bootstrap CIs, hierarchical (rounds, then requests
within the drawn round, paired with bare's same round).

    python benchmarks/observer_effect.py --rounds 4 --concurrency 32 --num-prompts 96 \\
        --input-len 2500 --output-len 200 [--variants bare,omnitrace,naive-otel] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent import futures

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from omnitrace.bench.serve_and_bench import free_port, wait_healthy  # noqa: E402

ALL = ("bare", "omnitrace", "flame-nb", "flame-b", "naive-otel")


def _receiver() -> tuple[object, int, list[int]]:
    """A real OTLP/gRPC trace receiver (official stubs) that counts spans and keeps none."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tsvc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsvc_grpc
    count = [0]

    class Sink(tsvc_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            count[0] += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            return tsvc.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    tsvc_grpc.add_TraceServiceServicer_to_server(Sink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, count


def _has_flame() -> bool:
    r = subprocess.run([sys.executable, "-m", "omnitrace", "run", "--help"], capture_output=True, text=True)
    return "--flame" in r.stdout


def _server_cmd(variant: str, port: int, run_dir: str, serve: list[str]) -> list[str]:
    py = [sys.executable, "-m", "omnitrace"]
    if variant in ("bare", "naive-otel"):
        return [*py, "serve", "--port", str(port), *serve]
    opts = []
    if variant.startswith("flame"):  # flame-nb, flame-b, or either with ":RATE"
        mode, _, rate = variant.partition(":")
        opts = ["--flame", "--flame-mode", "nonblocking" if mode == "flame-nb" else "blocking"]
        opts += ["--flame-rate", rate] if rate else []
    return [*py, "run", "--run-dir", run_dir, *opts, "serve", "--port", str(port), *serve]


def bench_cmd(port: int, args: argparse.Namespace, *more: str) -> list[str]:
    """`omnitrace bench` against the server on ``port`` with the load of ``args``."""
    return [sys.executable, "-m", "omnitrace", "bench", "--base-url", f"http://127.0.0.1:{port}",
            "--concurrency", str(args.concurrency), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--seed", str(args.seed), "--no-progress",
            *(("--request-rate", str(args.request_rate)) if getattr(args, "request_rate", None) else ()),
            *more]


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM (the server's and `omnitrace run`'s orderly stop), SIGKILL after 120 s."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(120)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run_one(variant: str, args: argparse.Namespace, work: str, otlp_port: int) -> dict:
    port = free_port()
    run_dir = os.path.join(work, f"{variant}-{time.time_ns()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    if variant == "naive-otel":
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "benchmarks", "naive_otel"),
                                             env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["NAIVE_OTEL_ENDPOINT"] = f"127.0.0.1:{otlp_port}"
    server = subprocess.Popen(_server_cmd(variant, port, run_dir, args.serve.split()), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = os.path.join(work, f"bench-{variant}-{time.time_ns()}.json")
    try:
        why = wait_healthy(f"http://127.0.0.1:{port}", server, 180)
        if why:
            raise RuntimeError(f"{variant}: {why}")
        subprocess.run(bench_cmd(port, args, "--num-prompts", str(args.num_prompts), "--out", out),
                       env=env, check=True, stdout=subprocess.DEVNULL)
    finally:
        stop_server(server)
    with open(out) as f:
        doc = json.load(f)
    reqs = [r for r in doc["requests"] if not r.get("warmup") and not r.get("error")]
    win = doc["levels"][0]["measured_window"]
    wall = (int(win["end_unix_ns"]) - int(win["start_unix_ns"])) / 1e9
    return {"variant": variant, "throughput": len(reqs) / wall if wall > 0 else 0.0,
            "ttfp": np.array([r["ttfp_s"] for r in reqs if r.get("ttfp_s") is not None]) * 1e3,
            "ttft": np.array([r["ttft_s"] for r in reqs if r.get("ttft_s") is not None]) * 1e3,
            "failed": sum(1 for r in doc["requests"] if r.get("error"))}


def _ci(rounds: list[tuple[dict, dict]], stat, rng: np.random.Generator, n: int = 2000) -> tuple:
    """Relative change of ``stat(variant)`` vs ``stat(bare)``: point estimate (mean over
    rounds) and 95% CI (rounds resampled, then requests within each drawn round)."""
    point = float(np.mean([stat(v, False, rng) / stat(b, False, rng) - 1 for v, b in rounds]))
    boots = np.empty(n)
    for i in range(n):
        pick = rng.integers(0, len(rounds), len(rounds))
        boots[i] = np.mean([stat(rounds[j][0], True, rng) / stat(rounds[j][1], True, rng) - 1 for j in pick])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return point, float(lo), float(hi)


def _pct(key: str, q: float):
    def stat(r: dict, resample: bool, rng: np.random.Generator) -> float:
        x = r[key]
        if resample:
            x = x[rng.integers(0, len(x), len(x))]
        return float(np.percentile(x, q))
    return stat


def _throughput(r: dict, resample: bool, rng: np.random.Generator) -> float:
    return r["throughput"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=None, help=f"comma list of {', '.join(ALL)} (default: all available)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--input-len", type=int, default=2500)
    p.add_argument("--output-len", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve", default="", help="server arguments (one string)")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    variants = args.variants.split(",") if args.variants else \
        [v for v in ALL if not v.startswith("flame") or _has_flame()]
    if "bare" not in variants:
        p.error("the variants must include bare (the baseline)")
    server, otlp_port, spans = _receiver()
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="observer-") as work:
        for rnd in range(args.rounds):
            shift = rnd % len(variants)
            order = variants[shift:] + variants[:shift]
            if rnd % 2:
                order = order[::-1]
            for v in order:
                t0 = time.monotonic()
                r = run_one(v, args, work, otlp_port)
                results[v].append(r)
                print(f"round {rnd + 1} {v:<11} {r['throughput']:6.2f} req/s  TTFP p50 "
                      f"{np.percentile(r['ttfp'], 50):8.1f} ms  p99 {np.percentile(r['ttfp'], 99):8.1f} ms  "
                      f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    server.stop(0)
    rng = np.random.default_rng(0)
    rows = []
    for v in variants:
        rs = results[v]
        row = {"variant": v, "rounds": len(rs),
               "throughput_req_s": float(np.median([r["throughput"] for r in rs])),
               "ttfp_p50_ms": float(np.median([np.percentile(r["ttfp"], 50) for r in rs])),
               "ttfp_p99_ms": float(np.median([np.percentile(r["ttfp"], 99) for r in rs])),
               "ttft_p50_ms": float(np.median([np.percentile(r["ttft"], 50) for r in rs])),
               "ttft_p99_ms": float(np.median([np.percentile(r["ttft"], 99) for r in rs])),
               "failed": sum(r["failed"] for r in rs)}
        if v != "bare":
            pairs = list(zip(rs, results["bare"]))
            for name, stat in (("throughput", _throughput), ("ttfp_p50", _pct("ttfp", 50)),
                               ("ttfp_p99", _pct("ttfp", 99)), ("ttft_p50", _pct("ttft", 50)),
                               ("ttft_p99", _pct("ttft", 99))):
                row[f"{name}_delta"] = _ci(pairs, stat, rng)
        rows.append(row)
    print(f"\nc={args.concurrency}, {args.num_prompts} measured requests, {args.input_len} in / "
          f"{args.output_len} out, {args.rounds} rounds; naive-otel spans received: {spans[0]}")
    print("| variant | req/s | Δ throughput [95% CI] | TTFP p50 ms | Δ TTFP p50 | TTFP p99 ms | Δ TTFP p99 "
          "| TTFT p50 ms | Δ TTFT p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    fmt = lambda d: "—" if d is None else f"{d[0] * 100:+.1f}% [{d[1] * 100:+.1f}, {d[2] * 100:+.1f}]"  # noqa: E731
    for r in rows:
        print(f"| {r['variant']} | {r['throughput_req_s']:.2f} | {fmt(r.get('throughput_delta'))} | "
              f"{r['ttfp_p50_ms']:.0f} | {fmt(r.get('ttfp_p50_delta'))} | {r['ttfp_p99_ms']:.0f} | "
              f"{fmt(r.get('ttfp_p99_delta'))} | {r['ttft_p50_ms']:.0f} | {fmt(r.get('ttft_p50_delta'))} |")
    omni = next((r for r in rows if r["variant"] == "omnitrace"), None)
    naive = next((r for r in rows if r["variant"] == "naive-otel"), None)
    if omni and naive and naive["throughput_delta"][0] < 0:
        print(f"\nomnitrace's throughput cost / naive OTel's: "
              f"{omni['throughput_delta'][0] / naive['throughput_delta'][0]:.3f} (target <= 1/50 = 0.02)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "naive_spans": spans[0]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
