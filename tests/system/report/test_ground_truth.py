"""Ground truth: inject a known delay into stage 1's chunk put (talker -> code2wav) on the
real reference pipeline; the report must attribute it to (stage 1, put) within 10%."""
from __future__ import annotations

from tests.support.report_util import pipeline_file, report_json, run_pipeline

DELAY_MS = 20.0
BENCH = ["--concurrency", "2", "--num-prompts", "8", "--input-len", "200", "--output-len", "30", "--seed", "3"]


def _means(rep: dict) -> dict[tuple[str, str], float]:
    return {(a["stage"], a["category"]): a["mean_ms"] for a in rep["attribution"]}


def test_injected_put_delay_is_attributed_to_stage1_put(tmp_path):
    base_dir, delay_dir = str(tmp_path / "base"), str(tmp_path / "delay")
    run_pipeline(base_dir, BENCH)
    pipe = pipeline_file(str(tmp_path / "p.yaml"), talker={"inject_put_delay_ms": DELAY_MS})
    run_pipeline(delay_dir, BENCH, serve_args=f"--pipeline {pipe}")
    base, delay = report_json(base_dir), report_json(delay_dir)
    assert base["window"]["attributed"] == delay["window"]["attributed"] == 8
    b, d = _means(base), _means(delay)
    put = d[("1:talker", "put")]
    delta = put - b.get(("1:talker", "put"), 0.0)
    print(f"\ninjected {DELAY_MS} ms; attributed (1:talker, put) {put:.3f} ms, delta vs baseline {delta:.3f} ms")
    assert abs(put - DELAY_MS) <= 0.1 * DELAY_MS
    assert abs(delta - DELAY_MS) <= 0.1 * DELAY_MS
    # every single request carries it on its critical path, in that category and stage (a
    # sleep never returns early; on a loaded machine it may return late, hence the median)
    per = sorted(r["categories_ms"]["1:talker/put"] for r in delay["requests"])
    assert per[0] >= 0.98 * DELAY_MS
    assert abs(per[len(per) // 2] - DELAY_MS) <= 0.1 * DELAY_MS
    # and no other category absorbed a comparable amount
    grew = {k: d.get(k, 0.0) - b.get(k, 0.0) for k in set(b) | set(d)}
    assert max(grew, key=grew.get) == ("1:talker", "put")
    assert delay["ttfp"]["sum_error_max_ns"] == 0
