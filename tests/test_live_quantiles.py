"""Live quantiles are the report's: the dashboards' quantile panels, evaluated by a real
Prometheus over a finished load test, equal `omnitrace report --json` on the same run.

The reference pipeline under `omnitrace run --exporter prometheus serve`, two Prometheus
servers scraping the agent each second (native histograms on and off), and two loads from
`omnitrace bench`: a warm-up, so every series exists before the measured window (rate()
cannot count what a series' first sample already holds), then a fixed number of requests,
the ones `bench.json` lists and the report measures. Once the last of them is in
Prometheus, every quantile panel's query is evaluated with its rate window set to the
measured load, and compared with the report's figure:

* TTFP p50/p99 against the report's per-request TTFPs: the sample quantile of n values is
  any value between the order statistics around rank q*n, so the panel must be within
  TOLERANCE of that range;
* FIFO residence, FIFO time behind others, snapshot and shm put/get p50/p99 per stage
  (pair) against the report's tables (thousands of chunks: the range is a point);
* the TTFP and snapshot mean lines against the report's means, within 1%.

TOLERANCE is 5%, or one native bucket's width where that is wider (2^(1/16) = 4.4%: it is
not). With native histograms every panel is within it; the negative control is the
classic buckets (2-2.5x apart) on the other Prometheus, where the same check must fail.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from omnitrace import conventions as cv
from tests.support import prom_util
from tests.support.agent_util import clean_env, stop_process
from tests.support.dashboard_util import prometheus_queries
from tests.support.otlp_receiver import free_port
from tests.support.system_deps import need

REQUESTS = 400
TOLERANCE = max(0.05, 2 ** (1 / cv.NATIVE_PER_DOUBLING) - 1)
MEAN_TOLERANCE = 0.01  # a mean line is sum over count: exact but for float sums
DEADLINE_S = 240


@pytest.fixture(autouse=True, scope="module")
def _prometheus_installed():
    need("prometheus", "prometheus")


def _quantile_panels() -> list:
    """The overview's quantile queries omnitrace's report also has a figure for, and the
    mean lines it has one for (TTFP, snapshot)."""
    keep = {"TTFP p50 / p99", "FIFO residence p50 / p99 per stage",
            "FIFO time behind other requests' tasks p50 / p99", "Snapshot duration p50 / p99 per stage",
            "Shared-memory put / get p99 per stage pair"}
    qs = [q for q in prometheus_queries()
          if q.dashboard == "omnitrace-overview.json" and q.panel in keep and (
              "histogram_quantile" in q.expr or (q.legend.endswith(" mean") and q.panel.startswith(("TTFP", "Snap"))))]
    assert {q.panel for q in qs} == keep, {q.panel for q in qs}
    assert sum(q.legend.endswith(" mean") for q in qs) == 2, [q.legend for q in qs]
    return qs


def all_in(proms: dict, n: int) -> bool:
    """Both Prometheus servers have seen ``n`` requests end."""
    return all(sum(prom_util.number(r) for r in prom_util.query(p, "omnitrace_requests_finished_total")) >= n
               for _, p in proms.values())


@pytest.fixture(scope="module")
def finished(tmp_path_factory, long_lived_processes):
    """Both Prometheus servers' answers to every quantile panel at the end of the load, and
    the report of the run."""
    tmp = tmp_path_factory.mktemp("quantiles")
    port, mport = free_port(), free_port()
    proms = {flavour: prom_util.start(tmp, mport, flavour) for flavour in prom_util.FLAVOURS}
    err = open(tmp / "run.err", "wb")  # noqa: SIM115 (closed in finally)
    run = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(tmp / "run"),
                            "--exporter", "prometheus", "--prometheus-port", str(mport),
                            "serve", "--port", str(port)],
                           env=clean_env(), stdout=subprocess.DEVNULL, stderr=err)
    long_lived_processes.add(run.pid)
    try:
        def up() -> bool:
            try:
                prom_util.get(f"http://127.0.0.1:{port}/health", timeout=1)
                return True
            except OSError:
                assert run.poll() is None, (tmp / "run.err").read_text()[-2000:]
                return False
        assert prom_util.wait(up, 90, 0.3), "the pipeline did not come up"

        def bench(n: int, out) -> None:
            subprocess.run([sys.executable, "-m", "omnitrace", "bench", "--base-url", f"http://127.0.0.1:{port}",
                            "--concurrency", "8", "--num-prompts", str(n), "--warmup", "0",
                            "--input-len", "300", "--output-len", "40", "--no-progress", "--out", str(out)],
                           env=clean_env(), check=True, stdout=subprocess.DEVNULL, timeout=600)
        # a warm-up load first: every series is born (its first scrape holds what came
        # before it, which rate() cannot count), then the measured load in a fresh window
        bench(8, tmp / "warmup.json")
        assert prom_util.wait(lambda: all_in(proms, 8), DEADLINE_S, 1.0), "Prometheus never saw the warm-up"
        time.sleep(3)
        t0 = time.time()
        bench(REQUESTS, tmp / "run" / "bench.json")
        assert prom_util.wait(lambda: all_in(proms, 8 + REQUESTS), DEADLINE_S, 1.0), \
            "Prometheus never saw every request end"
        time.sleep(3)
        at = time.time()
        window = f"[{int((at - t0) * 1000)}ms]"
        answers = {flavour: {(q.panel, q.legend, q.expr): prom_util.query(
                                 p, q.expr.replace("[1m]", window), time=f"{at:.3f}")
                             for q in _quantile_panels()}
                   for flavour, (_, p) in proms.items()}
    finally:
        stop_process(run, timeout=90)
        long_lived_processes.discard(run.pid)
        err.close()
        for prom, _ in proms.values():
            stop_process(prom)
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", str(tmp / "run"), "--json"],
                         env=clean_env(), capture_output=True, text=True, timeout=300, check=True)
    return answers, json.loads(rep.stdout)


def _expected(report: dict, panel: str, legend: str, metric: dict, q: float | None) -> tuple[float, float]:
    """The report's figure for one panel series (quantile ``q``, or the mean when None) as
    a (low, high) range in seconds."""
    pct = f"p{int(q * 100)}" if q is not None else "mean"
    stage = metric.get("stage")
    if panel == "TTFP p50 / p99":
        ttfp = np.sort([r["ttfp_ms"] for r in report["requests"] if r["ttfp_ms"] is not None]) / 1e3
        n = len(ttfp)
        if q is None:
            return float(ttfp.mean()), float(ttfp.mean())
        return float(ttfp[max(0, math.floor(q * n) - 1)]), float(ttfp[min(n - 1, math.ceil(q * n))])
    if panel.startswith("FIFO"):
        row = next(r for r in report["fifo"] if str(r["stage_id"]) == stage)
        v = row[("residence_" if panel.startswith("FIFO residence") else "blocked_") + pct + "_ms"] / 1e3
    elif panel.startswith("Snapshot"):
        v = next(r for r in report["snapshot"] if str(r["stage_id"]) == stage)[pct + "_us"] / 1e6
    else:
        pair = cv.stage_pair(int(metric["from_stage"]), int(metric["to_stage"]))
        row = next(r for r in report["transfer"] if r["pair"] == pair)
        v = row["put" if legend.startswith("put") else "get"][pct + "_us"] / 1e6
    return v, v


def _compare(answers: dict, report: dict) -> list[tuple[str, float, float, float, bool]]:
    """(series, panel value, report low, report high, within TOLERANCE) per series."""
    out = []
    for (panel, legend, expr), rows in answers.items():
        quantile = re.search(r"histogram_quantile\(([0-9.]+)", expr)
        q = float(quantile.group(1)) if quantile else None  # None: a mean line
        assert rows, f"{panel} [{legend}]: no data"
        for r in rows:
            got = prom_util.number(r)
            lo, hi = _expected(report, panel, legend, r["metric"], q)
            ok = abs(_off_by(got, lo, hi)) <= (TOLERANCE if q is not None else MEAN_TOLERANCE)
            name = f"{panel} [{legend.replace('{{stage_name}}', r['metric'].get('stage_name', ''))}]"
            out.append((name.replace("{{from_stage}}->{{to_stage}}",
                                     f"{r['metric'].get('from_stage')}->{r['metric'].get('to_stage')}"),
                        got, lo, hi, ok))
    return out


def _off_by(got: float, lo: float, hi: float) -> float:
    """How far outside [lo, hi] ``got`` is, relative to the nearer end (0 inside)."""
    return got / lo - 1 if got < lo else got / hi - 1 if got > hi else 0.0


def _table(rows: list) -> str:
    return "\n".join(f"  {'ok ' if ok else 'OFF'} {name}: panel {got * 1e3:.3f} ms, report "
                     f"{lo * 1e3:.3f}..{hi * 1e3:.3f} ms ({_off_by(got, lo, hi) * 100:+.1f}%)"
                     for name, got, lo, hi, ok in rows)


def test_native_quantile_panels_equal_the_report(finished):
    answers, report = finished
    assert report["window"]["measured"] == REQUESTS, report["window"]
    rows = _compare(answers["native"], report)
    print(f"\nnative histograms (tolerance {TOLERANCE:.1%}):\n" + _table(rows))
    stages = {name for name, *_ in rows if name.startswith("FIFO residence")}
    assert len(stages) >= 4, stages  # p50 and p99 of the thinker's and the talker's FIFOs
    off = [r for r in rows if not r[-1]]
    assert not off, "panels off the report:\n" + _table(off)


def test_classic_buckets_fail_the_same_check(finished):
    """The negative control: the classic buckets' quantiles are interpolated between bounds
    2-2.5x apart, and the check above catches them."""
    answers, report = finished
    rows = _compare(answers["classic"], report)
    print("\nclassic buckets:\n" + _table(rows))
    off = [r for r in rows if not r[-1]]
    assert len(off) >= len(rows) // 2, "the classic buckets passed a check meant to catch them:\n" + _table(rows)
