"""The dashboards' conventions, read from their JSON: no datasource UIDs (variables),
$__rate_interval, the panels the issue asks for and vLLM-Omni's own row, a trace opened
from Jaeger or Tempo. Grafana's types, promtool and the compose wiring:
tests/system/dashboards/test_dashboards_static.py."""
from __future__ import annotations

import json
import os
import re


from tests.support.dashboard_util import (GRAFANA_DIR, VLLM_METRIC, VLLM_OMNI_ROW, dashboard_files,
                                  load, panels, prometheus_queries)
def test_datasources_are_variables_and_rates_use_rate_interval():
    for path in dashboard_files():
        dash = load(path)
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert {"run", "datasource"} <= set(variables)
        refs = []

        def walk(node):
            if isinstance(node, dict):
                if "datasource" in node and isinstance(node["datasource"], dict):
                    refs.append(node["datasource"])
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)
        walk(dash)
        assert refs
        for ref in refs:
            if ref.get("type") == "grafana":  # the built-in annotation source
                continue
            m = re.fullmatch(r"\$\{(\w+)\}", ref.get("uid", ""))
            assert m, f"{path}: hard-coded datasource {ref}"
            assert variables[m.group(1)]["type"] == "datasource"
            assert variables[m.group(1)]["query"] == ref["type"], ref
        text = json.dumps(dash)
        for rng in re.findall(r"\[([^\]]*)\]\)", "".join(
                t.get("expr", "") for _, p in panels(dash) for t in p.get("targets", []))):
            assert rng == "$__rate_interval", f"{path}: range [{rng}] instead of $__rate_interval"
        assert "$__rate_interval" in text
def test_omnitrace_panels_cover_the_issue_and_vllm_omni_panels_are_their_own_row():
    queries = prometheus_queries()
    omni = [q for q in queries if not q.vllm_omni_only]
    vllm = [q for q in queries if q.vllm_omni_only]
    assert vllm and omni
    for q in queries:
        assert bool(VLLM_METRIC.search(q.expr)) == q.vllm_omni_only, (q.panel, q.expr)
        if q.vllm_omni_only:
            assert q.panel.startswith("vLLM-Omni: "), q.panel
    text = " ".join(q.expr for q in omni)
    for metric in ("omnitrace_requests_started_total", "omnitrace_requests_in_flight",
                   "omnitrace_request_ttfp_seconds_bucket", "omnitrace_request_ttft_seconds_bucket",
                   "omnitrace_ttfp_attribution_seconds_total", "omnitrace_requests_attributed_total",
                   "omnitrace_head_of_line_blocked_seconds_total", "omnitrace_fifo_residence_seconds_bucket",
                   "omnitrace_fifo_blocked_seconds_bucket", "omnitrace_fifo_depth_bucket",
                   "omnitrace_snapshot_duration_seconds", "omnitrace_transfer_put_duration_seconds_bucket",
                   "omnitrace_transfer_get_duration_seconds_bucket", "omnitrace_transfer_size_bytes_sum",
                   "omnitrace_events_dropped_total", "omnitrace_agent_lag_seconds",
                   "omnitrace_agent_export_spans_total", "omnitrace_agent_spans_sampled_out_total",
                   "omnitrace_stage_info"):
        assert metric in text, metric
    for metric in ("audio_ttfp_s", "audio_rtf", "transfer_tx_s", "transfer_rx_s", "transfer_in_flight_s",
                   "transfer_size_bytes", "num_requests_waiting"):
        assert any(metric in q.expr for q in vllm), metric
    # the latency panels carry exemplars (they open the trace)
    ex = {q.panel for q in omni if q.exemplar}
    assert any("TTFP" in p for p in ex) and any("FIFO residence" in p for p in ex)
    overview = load(os.path.join(GRAFANA_DIR, "omnitrace-overview.json"))
    assert {v["name"] for v in overview["templating"]["list"]} >= {"datasource", "run", "stage", "replica"}
    heat = [p for _, p in panels(overview) if p["type"] == "heatmap"]
    assert heat and all(t.get("format") == "heatmap" for p in heat for t in p["targets"])
    assert any(p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "percent"
               for _, p in panels(overview) if p["type"] == "timeseries"), "no stacked-share panel"
    assert [r for r, _ in panels(overview)].count(VLLM_OMNI_ROW) == len({q.panel for q in vllm})
def test_request_dashboard_opens_a_trace_from_jaeger_or_tempo():
    dash = load(os.path.join(GRAFANA_DIR, "omnitrace-request.json"))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["trace_id"]["type"] == variables["request_id"]["type"] == "textbox"
    tr = [p for _, p in panels(dash) if p["type"] == "traces"]
    assert {p["datasource"]["type"] for p in tr} == {"jaeger", "tempo"}
    assert all(p["targets"][0]["query"] == "$trace_id" for p in tr)
    tempo_search = [t for _, p in panels(dash) for t in p.get("targets", [])
                    if t["datasource"]["type"] == "tempo" and "$request_id" in t.get("query", "")]
    assert tempo_search and "span.omni.request.id" in tempo_search[0]["query"]
    from omnitrace import conventions as cv
    assert cv.ATTR_REQUEST_ID == "omni.request.id" and cv.SPAN_REQUEST in tempo_search[0]["query"]
    assert any("omnitrace_ttfp_attribution_seconds_total" in t.get("expr", "")
               for _, p in panels(dash) for t in p.get("targets", []))
