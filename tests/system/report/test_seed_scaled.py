"""The seed scenario, scaled down to fit the test suite: same 2,500-token prompts and
concurrency 32, 300 output tokens instead of 900, 32 measured requests, a GPU-like 30 ms
thinker step. Recursive vs copy snapshot: the report must show the snapshot cost per
chunk falling >= 10x, every measured request attributed, categories summing to TTFP.
The stage-0 FIFO residence p99 is printed, not asserted: with other work on the machine
it flipped between identical runs (282 vs 42 ms once), so that comparison lives in
benchmarks/seed_scenario.py, which runs the full scenario side by side.

Why these settings: the p99 must describe the steady decode, where the sender waits for
the GIL behind each step's 32 snapshots (~7 ms of recursive walks per step, ~0.4 ms of
copies). With 60 output tokens, the 32 measured requests' 20 MB chunk-0 puts, issued in
one burst, were over 1% of all chunks and set the p99 (copy vs recursive then varied
either way between identical runs). Reused segments (`--shm pool`) keep those puts short;
a new segment per 20 MB chunk varied 5x run to run here (page faults, unlink). Measured
with one extra core-burning process: p99 recursive 20.7 / 20.4 ms vs copy 12.5 / 14.3 ms."""
from __future__ import annotations

import pytest

from tests.support.report_util import pipeline_file, report_json, run_pipeline

BENCH = ["--concurrency", "32", "--num-prompts", "32", "--warmup", "4", "--input-len", "2500",
         "--output-len", "300", "--seed", "5"]


@pytest.mark.slow
def test_recursive_vs_copy(tmp_path):
    pipe = pipeline_file(str(tmp_path / "p.yaml"), thinker={"cost": {"base_ms": 30.0, "per_prefill_token_us": 2.0,
                                                                      "per_seq_us": 50.0}})
    reps = {}
    for strategy in ("recursive", "copy"):
        d = str(tmp_path / strategy)
        run_pipeline(d, BENCH, serve_args=f"--snapshot {strategy} --shm pool --pipeline {pipe}", timeout=300)
        reps[strategy] = report_json(d)
    snap = {k: next(s for s in r["snapshot"] if s["stage_id"] == 0) for k, r in reps.items()}
    fifo = {k: next(f for f in r["fifo"] if f["stage_id"] == 0) for k, r in reps.items()}
    ratio = snap["recursive"]["p50_us"] / snap["copy"]["p50_us"]
    print(f"\nsnapshot p50 per chunk: recursive {snap['recursive']['p50_us']:.1f} us, copy "
          f"{snap['copy']['p50_us']:.1f} us ({ratio:.1f}x); mean {snap['recursive']['mean_us']:.1f} vs "
          f"{snap['copy']['mean_us']:.1f} us")
    print(f"stage-0 FIFO residence p99: recursive {fifo['recursive']['residence_p99_ms']:.2f} ms, "
          f"copy {fifo['copy']['residence_p99_ms']:.2f} ms")
    for k, r in reps.items():
        assert r["window"]["attributed"] == 32 and r["ttfp"]["sum_error_max_ns"] == 0
        # head of line in wall time: every victim's blocked time within its TTFP at c=32
        assert r["head_of_line_victims"], "c=32: some request waited behind another in a FIFO"
        for v in r["head_of_line_victims"]:
            assert v["blocked_ms"] <= v["ttfp_ms"], v
        mean = r["ttfp"]["server_ms"]["mean"]
        rem = sum(a["mean_ms"] for a in r["attribution"] if a["category"] == "remainder")
        api_rem = sum(a["mean_ms"] for a in r["attribution"] if a["category"] == "remainder" and a["stage"] == "api")
        worst = max(r["head_of_line_victims"], key=lambda v: v["blocked_ms"] / v["ttfp_ms"])
        print(f"{k}: mean TTFP {mean:.1f} ms; remainder {rem:.3f} ms ({rem / mean:.2%}), api remainder "
              f"{api_rem:.3f} ms; API share: " + ", ".join(
                  f"{a['category']} {a['mean_ms']:.2f}" for a in r["attribution"] if a["stage"] == "api")
              + f"; worst victim blocked {worst['blocked_ms']:.1f} of {worst['ttfp_ms']:.1f} ms")
        assert rem <= 0.01 * mean
    assert ratio >= 10
