"""Live TTFP attribution (the agent's counters) agrees with the report's walk over the
run's record, and the live request counters agree with the bench.

Real reference pipeline under real load (`omnitrace run` around serve_and_bench); the
agent's final metrics message (metrics.jsonl, the same registry Prometheus scrapes) is
compared with `rules.attribution` run on the event log afterwards. A load that starts
long after the agent, in process: tests/unit/agent/test_attribution_view.py.
"""
from __future__ import annotations

import json
import os

import pytest

from omnitrace.analyze.chunkspans import request_spans
from omnitrace.analyze.rundir import load_run
from omnitrace.rules import attribution as at
from tests.support.report_util import run_pipeline

N = 12


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("live") / "run")
    run_pipeline(d, ["--concurrency", "6", "--num-prompts", str(N), "--input-len", "300",
                     "--output-len", "24", "--seed", "3"], serve_args="--snapshot recursive")
    return d


def _final_metrics(run_dir: str) -> dict[str, list[dict]]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        last = json.loads(f.read().splitlines()[-1])
    out: dict[str, list[dict]] = {}
    for rm in last["resourceMetrics"]:
        for sm in rm["scopeMetrics"]:
            for m in sm["metrics"]:
                if "sum" in m:
                    out[m["name"]] = m["sum"].get("dataPoints", [])
    return out


def _labels(dp: dict) -> dict:
    return {a["key"]: next(iter(a["value"].values())) for a in dp.get("attributes", [])}


def test_live_attribution_equals_report_walk(run_dir):
    metrics = _final_metrics(run_dir)
    live: dict[tuple[str, str], float] = {}
    for dp in metrics["omnitrace.ttfp.attribution.seconds"]:
        lab = _labels(dp)
        live[(lab["stage"], lab["category"])] = float(dp["asDouble"])
    attributed = int(metrics["omnitrace.requests.attributed"][0]["asInt"])

    run = load_run([run_dir], skip_warmup=False)
    offline: dict[tuple[str, str], float] = {}
    n = 0
    for r in request_spans(run).values():
        a = at.attribute(r)
        if a is None:
            continue
        n += 1
        for (stage, cat), ns in a.totals().items():
            offline[(str(stage), cat)] = offline.get((str(stage), cat), 0.0) + ns / 1e9
    # every request of the run (warm-up included) was attributed live and offline
    assert n >= N and attributed == n
    assert set(live) == set(offline)
    total = sum(offline.values())
    for key, v in offline.items():
        assert abs(live[key] - v) <= 0.01 * max(v, 1e-9) + 1e-9, (key, live[key], v)
    assert abs(sum(live.values()) - total) <= 0.01 * total
    # head-of-line counter = the fifo_blocked category, per stage
    hol = {_labels(dp)["stage"]: float(dp["asDouble"])
           for dp in metrics.get("omnitrace.head.of.line.blocked.seconds", [])}
    for (stage, cat), v in offline.items():
        if cat == at.FIFO_BLOCKED:
            assert abs(hol.get(stage, 0.0) - v) <= 0.01 * v + 1e-9


def test_live_request_counters(run_dir):
    metrics = _final_metrics(run_dir)
    started = int(metrics["omnitrace.requests.started"][0]["asInt"])
    finished = {_labels(dp)["status"]: int(dp["asInt"]) for dp in metrics["omnitrace.requests.finished"]}
    with open(os.path.join(run_dir, "bench.json")) as f:
        bench = json.load(f)
    sent = len(bench["requests"])  # measured and warm-up requests, all served
    assert started == sent
    assert finished == {"ok": sent}


@pytest.mark.parametrize("cuts", [1, 13, 200])
def test_view_on_the_record_in_any_cut_equals_the_walk(run_dir, cuts):
    """The view itself, fed the run's record in time order in `cuts` pieces (as the agent
    feeds it, but deterministic): its counters equal the report's walk exactly."""
    import numpy as np

    from omnitrace import eventlog
    from omnitrace.agent.attribution_view import AttributionView
    from omnitrace.agent.export_prometheus import Metrics
    from omnitrace.spanload import Part
    from omnitrace.spantable import SpanBuilder

    log = eventlog.read_event_log(run_dir)
    ev = np.sort(log.events, order="t", kind="stable")
    builder = SpanBuilder(log.rings)
    builder.ring_changed()
    metrics = Metrics()
    view = AttributionView(metrics, log.requests.strings, log.rings)
    view.SETTLE_S, view.SETTLE_NS = 0.0, 0
    seen = Part(log.rings, log.requests.strings)
    for part in np.array_split(ev, cuts):
        view.feed(builder.feed(part, 0.0), seen)
    view.feed(builder.flush(), seen)
    view.close(1.0)
    live = {(s.labels["stage"], s.labels["category"]): s.value
            for fam in metrics.registry.collect() if fam.name == "omnitrace_ttfp_attribution_seconds"
            for s in fam.samples if s.name.endswith("_total")}
    run = load_run([run_dir], skip_warmup=False)
    offline: dict[tuple[str, str], float] = {}
    for r in request_spans(run).values():
        a = at.attribute(r)
        for (stage, cat), ns in (a.totals().items() if a else ()):
            offline[(str(stage), cat)] = offline.get((str(stage), cat), 0.0) + ns / 1e9
    assert view.attributed == sum(1 for r in request_spans(run).values() if at.attribute(r))
    assert set(live) == set(offline)
    for k, v in offline.items():
        assert live[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    # the head-of-line leaderboard: the report's head-of-line table summed per culprit
    from omnitrace.analyze.report import build_report
    run.bench = None  # every request, warm-up included, as the live view walks them
    rep = build_report(run)
    assert rep["window"]["attributed"] == view.attributed
    assert rep["head_of_line_pairs"] == len(rep["head_of_line"]) > 0, "c=6: some request waited behind another"
    want: dict[str, float] = {}
    for h in rep["head_of_line"]:
        want[h["culprit"]] = want.get(h["culprit"], 0.0) + h["blocked_ms"]
    got = {who: ns / 1e6 for who, ns in view.culprit_ns.items()}
    assert got.keys() == want.keys()
    for who, ms in want.items():
        assert got[who] == pytest.approx(ms, rel=1e-9, abs=1e-9), who
    top = view.top_culprits()
    assert [c["culprit"] for c in top] == sorted(want, key=want.get, reverse=True)[:len(top)]
