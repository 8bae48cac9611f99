"""Live quantiles are the report's: the dashboards' quantile panels, evaluated by a real
Prometheus over a finished load test, equal `omnitrace report --json` on the same run.

The reference pipeline under `omnitrace run --exporter prometheus serve`, two Prometheus
servers scraping the agent each second (native histograms on and off), and two loads from
`omnitrace bench`: a warm-up, so every series exists before the measured window (rate()
cannot count what a series' first sample already holds), then a fixed number of requests,
the ones `bench.json` lists and the report measures. Once the last of them is in
Prometheus, every quantile panel's query is evaluated with its rate window set to the
measured load (opening on the last scrape before it began), and compared with the
report's figure:

* TTFP p50/p99 against the report's per-request TTFPs: the sample quantile of n values is
  any value between the order statistics around rank q*n, so the panel must be within
  TOLERANCE of that range (a tail with a gap there makes it wide: 0.37 | 0.43 ms at a
  get's p99 was seen);
* FIFO residence, FIFO time behind others, snapshot and shm put/get p50/p99 per stage
  (pair) the same way, against the durations of the spans `omnitrace export` rebuilds for
  the same requests; the report's own figure is checked to lie in that range;
* TTFT, E2E and payload build the same way (the report has no figure of its own for
  them), and every mean line against the spans' mean, within 1%.

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


# every latency panel of the overview: its quantiles and its mean line
LATENCY_PANELS = {"TTFP p50 / p99", "TTFT p50 / p99", "E2E p50 / p99", "FIFO residence p50 / p99 per stage",
                  "FIFO time behind other requests' tasks p50 / p99", "Snapshot duration p50 / p99 per stage",
                  "Payload build p50 / p99 per stage", "Shared-memory put / get p99 per stage pair"}


def _quantile_panels() -> list:
    """The overview's latency queries: quantiles and mean lines."""
    qs = [q for q in prometheus_queries()
          if q.dashboard == "omnitrace-overview.json" and q.panel in LATENCY_PANELS and (
              "histogram_quantile" in q.expr or q.legend.endswith(" mean"))]
    assert {q.panel for q in qs} == LATENCY_PANELS, {q.panel for q in qs}
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
        # each window opens on a scrape taken before the measured load began: one taken
        # after the first requests' observations would hold them as its baseline, and
        # rate() would not count them (the burst at the start is the FIFOs' slowest part)
        base_ms = {flavour: _last_scrape_ms(p) for flavour, (_, p) in proms.items()}
        bench(REQUESTS, tmp / "run" / "bench.json")
        assert prom_util.wait(lambda: all_in(proms, 8 + REQUESTS), DEADLINE_S, 1.0), \
            "Prometheus never saw every request end"
        time.sleep(3)
        at_ms = int(time.time() * 1000)  # each window: [base - 1 ms, at], holding the base scrape
        answers = {flavour: {(q.panel, q.legend, q.expr): prom_util.query(
                                 p, q.expr.replace("[1m]", f"[{at_ms - base_ms[flavour] + 1}ms]"),
                                 time=f"{at_ms / 1000:.3f}")
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
    subprocess.run([sys.executable, "-m", "omnitrace", "export", str(tmp / "run"), "--otlp-json",
                    str(tmp / "spans.jsonl")], env=clean_env(), capture_output=True, timeout=300, check=True)
    report = json.loads(rep.stdout)
    return answers, report, _durations(tmp / "spans.jsonl", {r["id"] for r in report["requests"]})


def _last_scrape_ms(pport: int) -> int:
    """The time (ms) of the newest scrape this Prometheus holds; it must be recent."""
    rows = prom_util.query(pport, "timestamp(omnitrace_requests_finished_total)")
    assert rows, "no scrape of the agent yet"
    newest = max(int(round(prom_util.number(r) * 1000)) for r in rows)
    assert time.time() * 1000 - newest < 10_000, ("the last scrape is stale", newest)
    return newest


def _durations(path, measured: set[str]) -> dict[tuple, np.ndarray]:
    """The measured requests' complete spans from `omnitrace export`, in seconds, by what a
    panel series shows: ("e2e",), ("ttft",), ("fifo" | "blocked" | "snapshot" | "process",
    stage) and ("put" | "get", producer, consumer)."""
    kinds = {cv.SPAN_FIFO: "fifo", cv.SPAN_SNAPSHOT: "snapshot", cv.SPAN_PROCESS: "process",
             cv.SPAN_PUT: "put", cv.SPAN_GET: "get", cv.SPAN_REQUEST: "request"}
    out: dict[tuple, list] = {}
    with open(path) as f:
        for line in f:
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        kind = kinds.get(s["name"])
                        attrs = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", ())}
                        if kind is None or attrs.get(cv.ATTR_INCOMPLETE) or attrs[cv.ATTR_REQUEST_ID] not in measured:
                            continue
                        start = int(s["startTimeUnixNano"])
                        dur = (int(s["endTimeUnixNano"]) - start) / 1e9
                        if kind == "request":  # E2E, and TTFT from its event
                            out.setdefault(("e2e",), []).append(dur)
                            out.setdefault(("ttft",), []).extend(
                                (int(e["timeUnixNano"]) - start) / 1e9 for e in s.get("events", ())
                                if e["name"] == cv.EVENT_TTFT)
                            continue
                        stage, peer = str(attrs[cv.ATTR_STAGE_ID]), str(attrs.get(cv.ATTR_PEER_STAGE_ID))
                        key = {"put": ("put", stage, peer), "get": ("get", peer, stage)}.get(kind, (kind, stage))
                        out.setdefault(key, []).append(dur)
                        if kind == "fifo":
                            out.setdefault(("blocked", stage), []).append(
                                min(int(attrs.get(cv.ATTR_FIFO_BLOCKED_NS, 0)) / 1e9, dur))
    return {k: np.sort(v) for k, v in out.items()}


def _around(values: np.ndarray, q: float) -> tuple[float, float]:
    """The sample quantiles of sorted ``values``: the order statistics around rank q*n (a
    tail with a gap at that rank makes them far apart; any value between is a quantile)."""
    n = len(values)
    return float(values[max(0, math.floor(q * n) - 1)]), float(values[min(n - 1, math.ceil(q * n))])


def _report_figure(report: dict, panel: str, legend: str, metric: dict, pct: str) -> float:
    """The report's own figure for a panel series, in seconds."""
    stage = metric.get("stage")
    if panel.startswith("FIFO"):
        row = next(r for r in report["fifo"] if str(r["stage_id"]) == stage)
        return row[("residence_" if panel.startswith("FIFO residence") else "blocked_") + pct + "_ms"] / 1e3
    if panel.startswith("Snapshot"):
        return next(r for r in report["snapshot"] if str(r["stage_id"]) == stage)[pct + "_us"] / 1e6
    pair = cv.stage_pair(int(metric["from_stage"]), int(metric["to_stage"]))
    row = next(r for r in report["transfer"] if r["pair"] == pair)
    return row["put" if legend.startswith("put") else "get"][pct + "_us"] / 1e6


_PER_STAGE = {"FIFO residence": "fifo", "FIFO time": "blocked", "Snapshot": "snapshot", "Payload": "process"}


def _values(report: dict, raw: dict, panel: str, legend: str, metric: dict) -> np.ndarray:
    """The sorted durations a panel series summarises (seconds)."""
    if panel.startswith("TTFP"):
        return np.sort([r["ttfp_ms"] for r in report["requests"] if r["ttfp_ms"] is not None]) / 1e3
    if panel.startswith(("TTFT", "E2E")):
        return raw[(panel.split()[0].lower(),)]
    kind = next((k for prefix, k in _PER_STAGE.items() if panel.startswith(prefix)), None)
    if kind:
        return raw[(kind, metric["stage"])]
    return raw[(legend.split()[0], metric["from_stage"], metric["to_stage"])]


def _expected(report: dict, raw: dict, panel: str, legend: str, metric: dict,
              q: float | None) -> tuple[float, float]:
    """What the panel series should read (quantile ``q``, or the mean when None) as a
    (low, high) range in seconds: for a quantile the sample quantiles of the spans'
    durations, for a mean theirs; where the report has the figure, it is checked to lie
    among them."""
    values = _values(report, raw, panel, legend, metric)
    lo, hi = _around(values, q) if q is not None else (float(values.mean()),) * 2
    figure = None
    if panel.startswith("TTFP"):
        figure = float(np.percentile(values, q * 100)) if q is not None else float(values.mean())
    elif panel.startswith(("FIFO", "Snapshot", "Shared")) and (q is not None or panel.startswith("Snapshot")):
        figure = _report_figure(report, panel, legend, metric, f"p{int(q * 100)}" if q is not None else "mean")
    if figure is not None:
        assert lo * (1 - 1e-6) <= figure <= hi * (1 + 1e-6), (panel, legend, metric, figure, lo, hi)
    return lo, hi


def _compare(answers: dict, report: dict, raw: dict) -> list[tuple[str, float, float, float, bool]]:
    """(series, panel value, report low, report high, within TOLERANCE) per series."""
    out = []
    for (panel, legend, expr), rows in answers.items():
        quantile = re.search(r"histogram_quantile\(([0-9.]+)", expr)
        q = float(quantile.group(1)) if quantile else None  # None: a mean line
        assert rows, f"{panel} [{legend}]: no data"
        for r in rows:
            got = prom_util.number(r)
            lo, hi = _expected(report, raw, panel, legend, r["metric"], q)
            ok = abs(_off_by(got, lo, hi)) <= (TOLERANCE if q is not None else MEAN_TOLERANCE)
            name = f"{panel} [{legend.replace('{{stage_name}}', r['metric'].get('stage_name', ''))}]"
            for label in ("from_name", "to_name"):
                name = name.replace("{{%s}}" % label, r["metric"].get(label, "?"))
            out.append((name, got, lo, hi, ok))
    return out


def _off_by(got: float, lo: float, hi: float) -> float:
    """How far outside [lo, hi] ``got`` is, relative to the nearer end (0 inside)."""
    return got / lo - 1 if got < lo else got / hi - 1 if got > hi else 0.0


def _table(rows: list) -> str:
    return "\n".join(f"  {'ok ' if ok else 'OFF'} {name}: panel {got * 1e3:.3f} ms, exact "
                     f"{lo * 1e3:.3f}..{hi * 1e3:.3f} ms ({_off_by(got, lo, hi) * 100:+.1f}%)"
                     for name, got, lo, hi, ok in rows)


def test_native_quantile_panels_equal_the_report(finished):
    answers, report, raw = finished
    assert report["window"]["measured"] == REQUESTS, report["window"]
    rows = _compare(answers["native"], report, raw)
    print(f"\nnative histograms (tolerance {TOLERANCE:.1%}):\n" + _table(rows))
    stages = {name for name, *_ in rows if name.startswith("FIFO residence")}
    assert len(stages) >= 4, stages  # p50 and p99 of the thinker's and the talker's FIFOs
    off = [r for r in rows if not r[-1]]
    assert not off, "panels off the report:\n" + _table(off)


def test_classic_buckets_fail_the_same_check(finished):
    """The negative control: the classic buckets' quantiles are interpolated between bounds
    2-2.5x apart, and the check above catches them (on the quantiles: the mean lines read
    _sum / _count, which classic buckets get right too)."""
    answers, report, raw = finished
    rows = _compare(answers["classic"], report, raw)
    print("\nclassic buckets:\n" + _table(rows))
    quantiles = [r for r in rows if not r[0].endswith("mean]")]
    off = [r for r in quantiles if not r[-1]]
    assert len(off) >= len(quantiles) // 2, \
        "the classic buckets passed a check meant to catch them:\n" + _table(rows)
