"""The dashboards against a live load test: the reference pipeline under
`omnitrace run --exporter prometheus,otlp-grpc serve`, `omnitrace bench` loading it, two
real Prometheus servers (Debian package, exemplar storage, 1 s scrape) scraping the agent,
one with native histograms on (protobuf scrapes) and one without (text scrapes, classic
buckets), and a real OTLP gRPC receiver (official stubs) taking the spans.

* every omnitrace panel's query (variables substituted as Grafana would) returns data
  through each Prometheus's HTTP API; the vLLM-Omni-only panels are listed and skipped;
* exemplars lead to traces: Prometheus's exemplar API returns trace ids for the TTFP and
  FIFO residence histograms, and each is a trace the OTLP exporter delivered;
* `promtool check metrics` on a live scrape prints nothing.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from omnitrace import conventions as cv
from omnitrace.top.source import parse_prometheus
from tests.support import prom_util
from tests.support.agent_util import clean_env, stop_process
from tests.support.dashboard_util import VLLM_METRIC, prometheus_queries, variable_queries
from tests.support.otlp_receiver import Store, free_port, start_grpc
from tests.support.prom_util import api as _api, get as _get, query as _query, number
from tests.support.system_deps import need


@pytest.fixture(autouse=True, scope="module")
def _prometheus_installed():
    need("prometheus", "prometheus")
    need("promtool", "prometheus")
DEADLINE_S = 180  # generous: other work shares the machine; every wait polls


def _wait(what, timeout: float = DEADLINE_S, step: float = 0.5):
    return prom_util.wait(what, timeout, step)


@pytest.fixture(scope="module")
def live(tmp_path_factory, long_lived_processes):
    tmp = tmp_path_factory.mktemp("dash")
    port, mport = free_port(), free_port()
    store = Store()
    grpc_server, gport = start_grpc(store)
    # two scrapers of the one endpoint: native histograms (protobuf) and classic (text)
    proms = {flavour: prom_util.start(tmp, mport, flavour) for flavour in prom_util.FLAVOURS}
    err = open(tmp / "run.err", "wb")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(tmp / "run"),
                             "--exporter", "prometheus,otlp-grpc", "--prometheus-port", str(mport),
                             "--otlp-endpoint", f"127.0.0.1:{gport}", "--otlp-timeout", "5",
                             "serve", "--port", str(port)],
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=err)
    long_lived_processes.add(proc.pid)
    bench = None

    def up() -> bool:
        try:
            _get(f"http://127.0.0.1:{port}/health", timeout=1)
            return True
        except OSError:
            assert proc.poll() is None, (tmp / "run.err").read_text()[-2000:]
            return False
    try:
        assert _wait(up, 90, 0.3), "the pipeline did not come up"
        # steady load for the whole module; concurrency 8 so FIFOs queue (head-of-line)
        bench = subprocess.Popen([sys.executable, "-m", "omnitrace", "bench", "--base-url",
                                  f"http://127.0.0.1:{port}", "--concurrency", "8", "--num-prompts", "4000",
                                  "--input-len", "300", "--output-len", "40", "--no-progress",
                                  "--out", str(tmp / "bench.json")],
                                 env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield {"pports": {f: p for f, (_, p) in proms.items()}, "mport": mport, "store": store,
               "start": time.time()}
    finally:
        if bench is not None:
            stop_process(bench, signal.SIGINT, 30)
        stop_process(proc, timeout=90)
        long_lived_processes.discard(proc.pid)
        err.close()
        for prom, _ in proms.values():
            stop_process(prom)
        grpc_server.stop(0)


@pytest.fixture(params=sorted(prom_util.FLAVOURS))
def pport(request, live) -> int:
    """Each test once per scraper: native histograms on, and off."""
    return live["pports"][request.param]


def test_every_omnitrace_panel_returns_data(live, pport):
    queries = prometheus_queries()
    omni = [q for q in queries if not q.vllm_omni_only]
    skipped = sorted({(q.dashboard, q.panel) for q in queries if q.vllm_omni_only})
    print("\nvLLM-Omni-only panels (need vLLM-Omni's --log-stats metrics), not evaluated here:")
    for d, p in skipped:
        print(f"  {d}: {p}")
    assert skipped and omni

    answered: set[int] = set()

    def all_answered() -> bool:
        answered.update(i for i, q in enumerate(omni) if i not in answered and _query(pport, q.expr))
        return len(answered) == len(omni)
    _wait(all_answered, step=1.0)
    empty = [f"{q.dashboard}: {q.panel} [{q.ref}]: {q.expr}" for i, q in enumerate(omni) if i not in answered]
    assert not empty, "panels without data:\n" + "\n".join(empty)
    print(f"{len(omni)} omnitrace queries of {len({(q.dashboard, q.panel) for q in omni})} panels answered")

    # what a user reads off them, once every stage has reported (the first answer may
    # predate the later stages' first chunks): stages by name, the report's categories,
    # FIFOs per producing stage, transfers per stage pair
    def panel(title: str) -> list:
        return [r for q in omni if q.panel == title
                for r in _query(pport, q.expr)]

    def labels(title: str, *keys: str) -> set:
        return {tuple(r["metric"].get(k) for k in keys) for r in panel(title)}
    attr = "TTFP attribution: mean seconds per request"
    expect = {(attr, ("stage_name",)): {("api",), ("thinker",), ("talker",), ("code2wav",)},
              (attr, ("category",)): {("compute",)},
              ("FIFO residence p50 / p99 per stage", ("stage",)): {("0",), ("1",)},
              ("Transfer bytes per second per stage pair", ("from_stage", "to_stage")): {("0", "1"), ("1", "2")}}
    for (title, keys), want in expect.items():
        seen = _wait(lambda: (v if want <= (v := labels(title, *keys)) else set()), step=1.0)  # noqa: B023
        assert want <= seen, (title, keys, labels(title, *keys))
    assert all(number(r) >= 0 for r in panel(attr))
    # legends name stages: every series of a per-stage query carries its stage_name
    # (omnitrace_stage_info joined, "api" for the API server); the FIFO panels have no API line
    named = [q for q in omni if "{{stage_name}}" in q.legend]
    assert len(named) >= 10, [q.panel for q in named]
    for q in named:
        rows = _query(pport, q.expr)
        assert rows and all(r["metric"].get("stage_name") for r in rows), (q.panel, q.ref, rows[:3])
    assert labels("FIFO residence p50 / p99 per stage", "stage_name") >= {("thinker",), ("talker",)}
    assert ("api",) not in labels("Head-of-line blocking per stage (seconds per request)", "stage_name")
    busy = panel("Sender busy share per stage")  # a share of one thread, per sender
    assert {r["metric"]["stage_name"] for r in busy} >= {"thinker", "talker"}, busy
    assert all(0 <= number(r) <= 1.0 for r in busy), busy
    assert any(number(r) > 0 for r in busy), busy
    # the agent's lag is true: the views take events each second, so they are up to ~1 s old
    lag = _query(pport, "max_over_time(omnitrace_agent_lag_seconds[10m])")
    assert lag and 0 < number(lag[0]) < 60, lag
    assert all(0 < number(r) < 60 for r in panel("TTFP p50 / p99"))

    # pairs by name too: both stages of every transfer series named, in legends and labels
    for q in omni:
        if "{{from_name}}" in q.legend:
            rows = _query(pport, q.expr)
            assert rows and all(r["metric"].get("from_name") and r["metric"].get("to_name") for r in rows), \
                (q.panel, q.ref, rows[:3])
    assert not [q.legend for q in omni if "{{from_stage}}" in q.legend or "{{stage}}" in q.legend.replace(
        "({{stage}})", "")], "a legend shows a bare stage number"
    # the head-of-line leaderboard: at most 10 requests, each one a request of the load
    culprits = panel("Head-of-line culprits: requests others waited behind most")
    assert 0 < len(culprits) <= 10 and all(number(r) > 0 for r in culprits), culprits
    assert panel("Agent endpoint") and all(number(r) == 1 for r in panel("Agent endpoint"))

    # the variables' label_values() queries list values too (vLLM-Omni's server: none here)
    for dash, name, selector, label in variable_queries():
        if VLLM_METRIC.search(selector):
            continue
        if label is None:  # query_result(): the FIFO stages, each with its name
            rows = _query(pport, selector)
            assert {(r["metric"]["stage"], r["metric"]["stage_name"]) for r in rows} == {
                ("0", "thinker"), ("1", "talker")}, (name, rows)
            continue
        series = _api(pport, "series", **{"match[]": selector})
        values = {s.get(label) for s in series} - {None}
        assert values, f"{dash}: variable {name}: no {label} values for {selector}"
        if name == "stage":
            assert {"-1", "0", "1", "2"} <= values


def _exemplars(pport: int, metric: str, start: float) -> dict[str, list[float]]:
    """trace id -> exemplar values, for the bucket series of ``metric``."""
    data = _api(pport, "query_exemplars", query=metric, start=f"{start - 60:.3f}", end=f"{time.time() + 5:.3f}")
    out: dict[str, list[float]] = defaultdict(list)
    for series in data:
        for ex in series["exemplars"]:
            out[ex["labels"]["trace_id"]].append(float(ex["value"]))
    return out


def _dropped_spans(mport: int) -> float:
    """The spans the agent's OTLP exporter dropped so far (its own counter, on /metrics,
    read as `omnitrace top` reads it)."""
    sample = parse_prometheus(_get(f"http://127.0.0.1:{mport}/metrics").decode(), time.time())
    return sum(v for lab, v in sample.series("omnitrace_agent_export_spans_total").items()
               if dict(lab).get("outcome") == "dropped")


def test_exemplars_lead_to_delivered_traces(live, pport):
    store = live["store"]
    found = {}
    # a native histogram's exemplars sit on its one series, a classic one's on its buckets
    suffix = "" if pport == live["pports"]["native"] else "_bucket"
    ttfp, fifo = "omnitrace_request_ttfp_seconds" + suffix, "omnitrace_fifo_residence_seconds" + suffix
    for metric in (ttfp, fifo):
        found[metric] = _wait(lambda: _exemplars(pport, metric, live["start"]))  # noqa: B023
        assert found[metric], f"no exemplars for {metric}"
    wanted = set().union(*found.values())
    for tid in wanted:
        assert len(tid) == 32 and int(tid, 16)

    def fifo_durations(spans: list) -> list[float]:
        return [(s.end_time_unix_nano - s.start_time_unix_nano) / 1e9 for s in spans if s.name == cv.SPAN_FIFO]

    def whole(by_trace: dict) -> set[str]:
        """The wanted traces delivered with their root span and, for a FIFO exemplar, the
        FIFO span it was taken from (a trace's spans arrive in the exporter's batches, in
        any order)."""
        return {t for t in wanted if any(s.name == cv.SPAN_REQUEST for s in by_trace[t])
                and all(any(abs(d - v) <= 1e-6 + 1e-6 * v for d in fifo_durations(by_trace[t]))
                        for v in found[fifo].get(t, ()))}

    by_trace: dict[str, list] = defaultdict(list)
    read = 0

    def delivered() -> bool:
        nonlocal read
        spans, read = store.spans_from(read)
        for s in spans:
            tid = s.trace_id.hex()
            if tid in wanted:
                by_trace[tid].append(s)
        return whole(by_trace) == wanted
    _wait(delivered)
    missing = wanted - whole(by_trace)
    # a load that outruns the receiver (this machine's other work) fills the exporter's
    # queue: the spans it drops, counted, take some traces with them. Then every exemplar
    # cannot lead to its trace, only those whose spans went out; none dropped: every one
    dropped = _dropped_spans(live["mport"])
    delivered_ids = wanted - missing
    print(f"\nexemplar traces: {len(wanted)}, delivered whole: {len(delivered_ids)}, spans dropped: {dropped}")
    if dropped:
        assert delivered_ids, f"spans dropped ({dropped}) and no exemplar trace delivered whole"
    else:
        assert not missing, f"exemplar trace ids with no delivered omni.request trace or FIFO span: {sorted(missing)[:5]}"
    by_trace = {t: by_trace[t] for t in delivered_ids}

    # each trace is that request's: the root span's request id hashes to the trace id
    for tid, spans in by_trace.items():
        root = next(s for s in spans if s.name == cv.SPAN_REQUEST)
        rid = next(kv.value.string_value for kv in root.attributes if kv.key == cv.ATTR_REQUEST_ID)
        assert f"{cv.trace_id_for(rid):032x}" == tid
    print(f"\nexemplar trace ids followed to delivered traces: "
          f"{ {m: len(ids) for m, ids in found.items()} }")
    # a TTFP exemplar's trace carries the first-audio-packet event
    for tid in set(found[ttfp]) & delivered_ids:
        root = next(s for s in by_trace[tid] if s.name == cv.SPAN_REQUEST)
        assert cv.EVENT_TTFP in {e.name for e in root.events}


def test_promtool_check_metrics_is_clean_on_a_live_scrape(live):
    url = f"http://127.0.0.1:{live['mport']}/metrics"
    # once requests have been attributed, every family the dashboards read has series
    def attributed() -> bytes:
        body = _get(url)
        return body if b"omnitrace_ttfp_attribution_seconds_total{" in body else b""
    body = _wait(attributed)
    assert body, "no attribution series on the endpoint"
    r = subprocess.run([prom_util.PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b"", (r.stdout + r.stderr).decode()[-3000:]
    # the check does speak up: the same scrape with a counter missing its _total suffix
    bad = body.replace(b"omnitrace_requests_started_total", b"omnitrace_requests_started_count_x")
    bad = bad.replace(b"# TYPE omnitrace_requests_started counter",
                      b"# TYPE omnitrace_requests_started_count_x counter")
    r = subprocess.run([prom_util.PROMTOOL, "check", "metrics"], input=bad, capture_output=True, timeout=60)
    assert r.stdout + r.stderr, "promtool check metrics flagged nothing on a bad counter name"
