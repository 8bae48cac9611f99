#!/usr/bin/env python3
"""Build omnitrace's Grafana dashboards (dashboards/grafana/*.json) from this one file.

    python dashboards/generate.py           # rewrite the JSON files
    python dashboards/generate.py --check   # exit 1 if a committed file differs

Conventions (those of vLLM's dashboards): every query names its data source through a
variable (``${datasource}``, ``${jaeger}``, ``${tempo}``), never a UID; rates use
``$__rate_interval``; ``$run``, ``$stage``, ``$replica`` filter every omnitrace series.
A *run* is one agent's ``/metrics`` endpoint (the Prometheus ``instance`` label): runs
that overlap in time have different endpoints, runs on the same port follow each other.
Panels reading vLLM-Omni's own metrics (``vllm_omni:*``, ``vllm:*``, only served with
``--log-stats``) sit in their own row and say so in their title.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "grafana")
SCHEMA_VERSION = 41  # Grafana 11.6 / 12
VLLM_OMNI_ROW = "vLLM-Omni's own metrics (only with --log-stats)"

PROM = {"type": "prometheus", "uid": "${datasource}"}
JAEGER = {"type": "jaeger", "uid": "${jaeger}"}
TEMPO = {"type": "tempo", "uid": "${tempo}"}

RUN = 'instance=~"$run"'
VLLM = 'instance=~"$vllm"'  # vLLM-Omni's API server (its own /metrics, a job of its own)
STAGE = f'{RUN}, stage=~"$stage", replica=~"$replica"'
RI = "[$__rate_interval]"
NO_TRAFFIC = "no requests in this window"
STAGE_NAMES = f"max by (stage, stage_name) (omnitrace_stage_info{{{RUN}}})"  # what legends join on
ATTRIBUTED = f"scalar(sum(rate(omnitrace_requests_attributed_total{{{RUN}}}{RI})))"

Json = dict[str, Any]


# --------------------------------------------------------------------------- queries
def prom(expr: str, legend: str = "", exemplar: bool = False, fmt: str | None = None) -> Json:
    t: Json = {"datasource": PROM, "expr": expr, "legendFormat": legend, "range": True,
               "instant": False, "exemplar": exemplar}
    if fmt:
        t["format"] = fmt
    return t


def quantiles(metric: str, by: str, legend: str, sel: str = STAGE, qs=(0.5, 0.99),
              exemplar: bool = True, mean: bool = True) -> list[Json]:
    """p50/p99 of a histogram (interpolated within its buckets), and its exact mean (sum
    over count), one series per ``by`` label set; a ``stage`` label gets its name."""
    labels = f"{{{sel}}}" if sel else ""
    name = named if by == "stage" else pair_named if by == "from_stage, to_stage" else (lambda e: e)
    out = [prom(name(hist_quantile(q, metric, by, labels)), f"{legend} p{int(q * 100)}", exemplar)
           for q in qs]
    if mean:
        out.append(prom(name(f"{hist_part('sum', metric, by, labels)} / {hist_part('count', metric, by, labels)}"),
                        f"{legend} mean"))
    return out


def native_or_classic(metric: str, native: str, classic: str) -> str:
    """omnitrace's histograms are native and classic at once: a Prometheus with native
    histograms on (it scrapes protobuf) stores only the native series, one without only
    the classic ``_bucket``/``_sum``/``_count`` series; the query reads whichever exists.
    Other exporters' histograms (vLLM-Omni's) are classic only."""
    # parenthesised whole: "or" binds looser than "/" (a mean divides two of these)
    return f"(({native}) or ({classic}))" if metric.startswith("omnitrace_") else classic


def hist_quantile(q: float, metric: str, by: str, labels: str) -> str:
    agg = f"sum by ({by})" if by else "sum"
    return native_or_classic(
        metric, f"histogram_quantile({q}, {agg} (rate({metric}{labels}{RI})))",
        f"histogram_quantile({q}, sum by ({'le, ' + by if by else 'le'}) (rate({metric}_bucket{labels}{RI})))")


def hist_part(part: str, metric: str, by: str, labels: str) -> str:
    """Per-second rate of a histogram's ``sum`` or ``count``, per ``by`` label set."""
    agg = f"sum by ({by})" if by else "sum"
    return native_or_classic(metric, f"histogram_{part}({agg} (rate({metric}{labels}{RI})))",
                             f"{agg} (rate({metric}_{part}{labels}{RI}))")


def named(expr: str, on: str = "stage") -> str:
    """``expr`` (series per ``stage``) with each one's ``stage_name`` joined from
    omnitrace_stage_info; the API server (stage -1, no stage info) is named "api". Legends
    show names, not numbers."""
    return (f"(({expr}) * on (stage) group_left (stage_name) {STAGE_NAMES}) or on ({on}) "
            f'label_replace({expr}, "stage_name", "api", "stage", "-1")')


def pair_named(expr: str) -> str:
    """``expr`` (series per ``from_stage``, ``to_stage``) with both stages' names joined
    as ``from_name`` and ``to_name``; a pair without stage info keeps its numbers only
    (vLLM-Omni's own series, when omnitrace does not run beside it)."""
    joined = expr
    for side in ("from", "to"):  # label_join copies a label (label_replace's "$1" is Grafana's syntax too)
        joined = (f'label_join(label_join({joined}, "stage", "", "{side}_stage") '
                  f'* on (stage) group_left (stage_name) {STAGE_NAMES}, "{side}_name", "", "stage_name")')
    return f'label_join({joined}, "stage", "") or on (from_stage, to_stage) ({expr})'


def attribution() -> str:
    """Mean TTFP seconds per attributed request, by stage x category, stages named."""
    rate = (f"sum by (stage, category) (rate(omnitrace_ttfp_attribution_seconds_total"
            f'{{{RUN}, stage=~"$stage"}}{RI}))')
    return f"({named(rate, 'stage, category')}) / {ATTRIBUTED}"


def zero_if_absent(expr: str, like: str, by: str) -> str:
    """``expr``, or 0 for each ``by`` group of ``like`` where ``expr`` has no series yet
    (a counter's labelled series appears only at its first increment, e.g. drops)."""
    return f"{expr} or sum by ({by}) (0 * {like})"


# --------------------------------------------------------------------------- panels
class Layout:
    """Places panels left to right, 24 columns wide, and numbers them."""

    def __init__(self) -> None:
        self.x = self.y = self.row_h = 0
        self.next_id = 1
        self.panels: list[Json] = []

    def add(self, p: Json, w: int = 12, h: int = 8) -> Json:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_h
            self.row_h = 0
        p["id"], self.next_id = self.next_id, self.next_id + 1
        p["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(p)
        return p

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y = 0, self.y + self.row_h
        self.row_h = 0
        self.add({"type": "row", "title": title, "collapsed": False, "panels": []}, w=24, h=1)
        self.x, self.y, self.row_h = 0, self.y + 1, 0


def _legend(placement: str = "bottom", calcs: list[str] | None = None) -> Json:
    return {"showLegend": True, "displayMode": "table" if calcs else "list", "placement": placement,
            "calcs": calcs or []}


def timeseries(title: str, desc: str, targets: list[Json], unit: str, stack: str = "none",
               fill: int = 10, min0: bool = True, thresholds: list[Json] | None = None,
               no_value: str = "") -> Json:
    custom: Json = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 80 if stack != "none" else fill,
                    "showPoints": "never", "spanNulls": False,
                    "stacking": {"mode": stack, "group": "A"}}
    defaults: Json = {"unit": unit, "custom": custom}
    if no_value:  # what the panel says instead of "No data"
        defaults["noValue"] = no_value
    if min0:
        defaults["min"] = 0
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
        custom["thresholdsStyle"] = {"mode": "line"}
    return {"type": "timeseries", "title": title, "description": desc, "datasource": PROM,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": _legend(calcs=["mean", "max"]),
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": _ref(targets)}


def heatmap(title: str, desc: str, target: Json, repeat: str) -> Json:
    """One heatmap per value of the variable ``repeat``, side by side."""
    return {"type": "heatmap", "title": title, "description": desc, "datasource": PROM,
            "repeat": repeat, "repeatDirection": "h", "maxPerRow": 2,
            "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"},
                                                    "hideFrom": {"legend": False, "tooltip": False,
                                                                 "viz": False}}},
                            "overrides": []},
            "options": {"calculate": False, "cellGap": 1, "showValue": "auto",
                        "color": {"mode": "scheme", "scheme": "Oranges", "fill": "dark", "scale": "exponential",
                                  "exponent": 0.5, "steps": 64, "reverse": False},
                        "exemplars": {"color": "rgba(255,0,255,0.7)"},
                        "filterValues": {"le": 1e-9},
                        "legend": {"show": True},
                        "rowsFrame": {"layout": "auto"},
                        "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
                        "yAxis": {"axisPlacement": "left", "unit": "s", "reverse": False}},
            "targets": _ref([target])}


def stat(title: str, desc: str, target: Json, mappings: list[Json], no_value: str) -> Json:
    return {"type": "stat", "title": title, "description": desc, "datasource": PROM,
            "fieldConfig": {"defaults": {"mappings": mappings, "noValue": no_value,
                                         "color": {"mode": "thresholds"},
                                         "thresholds": {"mode": "absolute",
                                                        "steps": [{"color": "red", "value": None},
                                                                  {"color": "green", "value": 1}]}},
                            "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "none", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "auto", "wideLayout": True,
                        "showPercentChange": False},
            "targets": _ref([target])}


def bargauge(title: str, desc: str, targets: list[Json], unit: str) -> Json:
    return {"type": "bargauge", "title": title, "description": desc, "datasource": PROM,
            "fieldConfig": {"defaults": {"unit": unit, "min": 0,
                                         "color": {"mode": "continuous-BlYlRd"}},
                            "overrides": []},
            "options": {"orientation": "horizontal", "displayMode": "gradient",
                        "valueMode": "color", "namePlacement": "auto", "showUnfilled": True,
                        "sizing": "auto", "minVizHeight": 16, "minVizWidth": 8, "maxVizHeight": 300,
                        "legend": _legend(),
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            "targets": _ref(targets)}


def text(title: str, content: str) -> Json:
    return {"type": "text", "title": title,
            "options": {"mode": "markdown", "content": content,
                        "code": {"language": "plaintext", "showLineNumbers": False,
                                 "showMiniMap": False}}}


def traces(title: str, desc: str, ds: Json, target: Json) -> Json:
    return {"type": "traces", "title": title, "description": desc, "datasource": ds,
            "options": {}, "targets": _ref([{"datasource": ds, **target}])}


def trace_table(title: str, desc: str, ds: Json, target: Json) -> Json:
    return {"type": "table", "title": title, "description": desc, "datasource": ds,
            "fieldConfig": {"defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"},
                                                    "inspect": False}},
                            "overrides": []},
            "options": {"showHeader": True, "cellHeight": "sm", "frameIndex": 0},
            "targets": _ref([{"datasource": ds, **target}])}


def _ref(targets: list[Json]) -> list[Json]:
    return [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)]


# --------------------------------------------------------------------------- variables
def ds_var(name: str, label: str, plugin: str) -> Json:
    return {"name": name, "label": label, "type": "datasource", "query": plugin,
            "current": {"text": "", "value": ""},
            "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": ""}


def query_var(name: str, label: str, query: str) -> Json:
    return {"name": name, "label": label, "type": "query", "datasource": PROM,
            "query": query,
            "current": {"text": ["All"], "value": ["$__all"]}, "hide": 0, "includeAll": True, "multi": True,
            "allValue": ".*", "options": [], "refresh": 2, "regex": "", "sort": 3}


def textbox(name: str, label: str, desc: str) -> Json:
    return {"name": name, "label": label, "description": desc, "type": "textbox", "query": "",
            "current": {"text": "", "value": ""}, "hide": 0,
            "options": [{"selected": True, "text": "", "value": ""}]}


RUN_VAR = query_var("run", "Run (agent endpoint)", "label_values(omnitrace_agent_open_requests, instance)")
# stages with a FIFO, valued by id and shown by name (Grafana's regex with text/value groups)
FIFO_STAGE_VAR = {**query_var("fifo_stage", "FIFO stage",
                              'query_result(max by (stage, stage_name) (omnitrace_stage_info{instance=~"$run"}) '
                              'and on (stage) count by (stage) ({__name__=~"omnitrace_fifo_depth(_count)?", '
                              'instance=~"$run"}))'),
                  "regex": '/stage="(?<value>[^"]+)".*stage_name="(?<text>[^"]+)"/'}
VLLM_VAR = query_var("vllm", "vLLM-Omni server", "label_values(vllm_omni:num_requests_running, instance)")
STAGE_VAR = query_var("stage", "Stage", f"label_values(omnitrace_events_total{{{RUN}}}, stage)")
REPLICA_VAR = query_var("replica", "Replica",
                        f'label_values(omnitrace_events_total{{{RUN}, stage=~"$stage"}}, replica)')


def dashboard(uid: str, title: str, desc: str, variables: list[Json], panels: list[Json],
              links: list[Json]) -> Json:
    return {"uid": uid, "title": title, "description": desc, "tags": ["omnitrace"],
            "editable": True, "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1,
            "refresh": "5s", "time": {"from": "now-15m", "to": "now"}, "timezone": "browser",
            "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
            "timepicker": {"refresh_intervals": ["5s", "10s", "30s", "1m", "5m"]},
            "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                      "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                      "name": "Annotations & Alerts", "type": "dashboard"}]},
            "links": links, "templating": {"list": variables}, "panels": panels}


def _link(title: str, uid: str) -> Json:
    return {"title": title, "type": "link", "url": f"/d/{uid}", "icon": "dashboard", "tags": [],
            "asDropdown": False, "includeVars": True, "keepTime": True, "targetBlank": False,
            "tooltip": ""}


# --------------------------------------------------------------------------- overview
def overview() -> Json:
    L = Layout()
    L.row("Load and latency")
    L.add(stat("Agent endpoint", "Whether Prometheus reaches the agent's /metrics now (the run's "
               "`omnitrace run` is up); DOWN when the run ended or the agent is unreachable.",
               prom(f"max(up{{{RUN}}})", "up"),
               [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"},
                                              "1": {"text": "UP", "color": "green"}}}],
               "no run scraped"), w=4)
    L.add(timeseries("Requests per second", "Requests arriving at the API server, and ending by status.", [
        prom(f"sum(rate(omnitrace_requests_started_total{{{RUN}}}{RI}))", "started"),
        prom(f"sum by (status) (rate(omnitrace_requests_finished_total{{{RUN}}}{RI}))", "finished {{status}}"),
    ], "reqps"), w=12)
    L.add(timeseries("Requests in flight", "Arrived at the API server and not yet ended.", [
        prom(f"sum(omnitrace_requests_in_flight{{{RUN}}})", "in flight"),
    ], "short"), w=8)
    L.add(timeseries("TTFP p50 / p99", "Time to first audio packet at the API server. "
                     "Exemplars (dots) open the request's trace.",
                     quantiles("omnitrace_request_ttfp_seconds", "", "TTFP", sel=RUN), "s",
                     no_value=NO_TRAFFIC), w=8)
    L.add(timeseries("TTFT p50 / p99", "Time to first text token at the API server. "
                     "Exemplars open the request's trace.",
                     quantiles("omnitrace_request_ttft_seconds", "", "TTFT", sel=RUN), "s",
                     no_value=NO_TRAFFIC), w=8)
    L.add(timeseries("E2E p50 / p99", "Arrival to the end of the response at the API server. "
                     "Exemplars open the request's trace.",
                     quantiles("omnitrace_request_e2e_seconds", "", "E2E", sel=RUN), "s",
                     no_value=NO_TRAFFIC), w=8)

    L.row("Where TTFP goes (live attribution of completed requests)")
    L.add(timeseries("TTFP attribution: share per stage x category",
                     "Each completed request's TTFP split along its critical path by stage and cause "
                     "(the categories of `omnitrace report`); stacked to 100%. A request counts "
                     "once it settles, ~1 s after its end, so the stack trails the TTFP panel.",
                     [prom(attribution(), "{{stage_name}} ({{stage}}) {{category}}")], "s",
                     stack="percent", no_value=NO_TRAFFIC), w=12, h=10)  # the axis is in %, the tooltip in seconds
    L.add(timeseries("TTFP attribution: mean seconds per request",
                     "The same split in seconds per attributed request; the stack sums to the mean TTFP "
                     "of the requests completed in the window.",
                     [prom(attribution(), "{{stage_name}} ({{stage}}) {{category}}")], "s",
                     stack="normal", no_value=NO_TRAFFIC), w=12, h=10)
    L.add(timeseries("Head-of-line blocking per stage (seconds per request)",
                     "FIFO time on requests' critical paths spent behind other requests' tasks, "
                     "per attributed request.",
                     # the stages only: the API server has no FIFO (its line would be zero)
                     [prom("(" + named(zero_if_absent(
                         f"sum by (stage) (rate(omnitrace_head_of_line_blocked_seconds_total"
                         f'{{{RUN}, stage=~"$stage", stage!="-1"}}{RI}))',
                         f'rate(omnitrace_ttfp_attribution_seconds_total{{{RUN}, stage=~"$stage", stage!="-1"}}{RI})',
                         "stage")) + f") / {ATTRIBUTED}", "{{stage_name}}")], "s"), w=12)
    L.add(bargauge("Head-of-line culprits: requests others waited behind most",
                   "The live top 10 requests whose chunk tasks other requests' first packets waited "
                   "behind in a FIFO (seconds of those waits, the report's head-of-line rule). "
                   "Paste one into the request dashboard.",
                   [prom(f"topk(10, max by (culprit) (omnitrace_head_of_line_culprit_seconds{{{RUN}}}))",
                         "{{culprit}}")], "s"), w=12)
    L.add(bargauge("TTFP attribution now (mean seconds per request)",
                   "Latest value of the attribution, largest first: where TTFP goes right now.",
                   [prom(attribution(), "{{stage_name}} ({{stage}}) {{category}}")], "s"), w=12)

    L.row("Stage FIFOs (producer side: chunk task enqueue -> dequeue)")
    L.add(timeseries("FIFO residence p50 / p99 per stage",
                     "How long chunk tasks sat in each stage's FIFO. Exemplars open a trace.",
                     quantiles("omnitrace_fifo_residence_seconds", "stage", "{{stage_name}}"), "s"), w=12)
    one = f'{RUN}, stage=~"$fifo_stage", replica=~"$replica"'
    L.add(heatmap("FIFO residence distribution: ${fifo_stage:text}",
                  "Chunk tasks per residence bucket per second, one heatmap per stage with a FIFO "
                  "(the FIFO stage variable).",
                  prom(native_or_classic(
                      "omnitrace_fifo_residence_seconds", f"sum(rate(omnitrace_fifo_residence_seconds{{{one}}}{RI}))",
                      f"sum by (le) (rate(omnitrace_fifo_residence_seconds_bucket{{{one}}}{RI}))"),
                       "{{le}}", exemplar=True, fmt="heatmap"), repeat="fifo_stage"), w=12)
    L.add(timeseries("FIFO time behind other requests' tasks p50 / p99",
                     "Part of each task's residence spent while the sender worked on other "
                     "requests' tasks (head-of-line blocking). Exemplars open a trace.",
                     quantiles("omnitrace_fifo_blocked_seconds", "stage", "{{stage_name}}"), "s"), w=12)
    L.add(timeseries("FIFO depth after enqueue p50 / p99", "Tasks in the FIFO after each enqueue.",
                     quantiles("omnitrace_fifo_depth", "stage", "{{stage_name}}", exemplar=False),
                     "short"), w=12)
    L.add(timeseries("Sender busy share per stage",
                     "The share of each stage's sender thread spent on chunk tasks (dequeue to put end). "
                     "Near 100% the sender is the bottleneck: tasks queue behind each other in the FIFO.",
                     [prom(named(f"sum by (stage, replica) (rate(omnitrace_sender_busy_seconds_total"
                                 f"{{{STAGE}}}{RI}))"), "{{stage_name}} replica {{replica}}")],
                     "percentunit"), w=12)

    L.row("Snapshots and transfers (per stage pair: from_stage -> to_stage)")
    L.add(timeseries("Snapshot duration p50 / p99 per stage",
                     "Request snapshot per chunk on the scheduler thread. Exemplars open a trace.",
                     quantiles("omnitrace_snapshot_duration_seconds", "stage", "{{stage_name}}"), "s"), w=12)
    L.add(timeseries("Scheduler time spent snapshotting",
                     "Snapshot seconds per second, per stage: the share of the scheduler thread.",
                     [prom(named(hist_part("sum", "omnitrace_snapshot_duration_seconds", "stage", f"{{{STAGE}}}")),
                           "{{stage_name}}")], "percentunit"), w=12)
    L.add(timeseries("Payload build p50 / p99 per stage",
                     "Building each chunk's payload on the sender thread, between its dequeue and its "
                     "shared-memory put. Exemplars open a trace.",
                     quantiles("omnitrace_payload_build_duration_seconds", "stage", "{{stage_name}}"), "s"), w=12)
    L.add(timeseries("Shared-memory put / get p99 per stage pair",
                     "Put on the producer's sender thread, get on the consumer's receiver thread.",
                     quantiles("omnitrace_transfer_put_duration_seconds", "from_stage, to_stage",
                               "put {{from_name}}->{{to_name}}", qs=(0.99,))
                     + quantiles("omnitrace_transfer_get_duration_seconds", "from_stage, to_stage",
                                 "get {{from_name}}->{{to_name}}", qs=(0.99,)), "s"), w=12)
    L.add(timeseries("Transfer bytes per second per stage pair", "Bytes put into shared memory.",
                     [prom(pair_named(hist_part("sum", "omnitrace_transfer_size_bytes", "from_stage, to_stage",
                                                f"{{{STAGE}}}")), "{{from_name}}->{{to_name}}")], "Bps"), w=12)

    L.row("omnitrace itself: drops, lag, exporter loss")
    recorded = f"rate(omnitrace_events_total{{{STAGE}}}{RI})"
    L.add(timeseries("Events recorded and dropped per second",
                     "Dropped = a hook found its ring full (raise --ring-records). Should stay 0.", [
                         prom(named(f"sum by (stage) ({recorded})"), "recorded {{stage_name}}"),
                         prom(named(zero_if_absent(f"sum by (stage) (rate(omnitrace_events_dropped_total"
                                                   f"{{{STAGE}}}{RI}))", recorded, "stage")),
                              "dropped {{stage_name}}"),
                     ], "short"), w=6)
    L.add(timeseries("Agent lag", "How long the oldest event of the live views' latest feed had waited since its "
                     "hook wrote it (the drain cycle, the one-second view period, any backlog).",
                     [prom(f"max(omnitrace_agent_lag_seconds{{{RUN}}})", "lag")], "s"), w=4)
    L.add(timeseries("Events the live views skipped per second",
                     "Recorded (nothing is lost from the run directory) but not seen live.",
                     [prom(f"sum(rate(omnitrace_agent_view_events_skipped_total{{{RUN}}}{RI}))", "skipped")],
                     "short"), w=4)
    L.add(timeseries("Spans per second by exporter and outcome",
                     "exported / failed / dropped per OTLP exporter, and spans left out by tail "
                     "sampling while a collector fell behind.", [
                         prom(f"sum by (exporter, outcome) (rate(omnitrace_agent_export_spans_total{{{RUN}}}{RI}))",
                              "{{exporter}} {{outcome}}"),
                         prom(f"sum(rate(omnitrace_agent_spans_sampled_out_total{{{RUN}}}{RI}))", "sampled out"),
                     ], "short"), w=6)
    L.add(timeseries("Requests the agent holds state for", "Open requests in the agent's span builder.",
                     [prom(f"sum(omnitrace_agent_open_requests{{{RUN}}})", "open")], "short"), w=4)

    L.row(VLLM_OMNI_ROW)
    L.add(timeseries("vLLM-Omni: audio TTFP p50 / p99", "vLLM-Omni's own audio TTFP (vllm_omni:audio_ttfp_s).",
                     quantiles("vllm_omni:audio_ttfp_s", "", "audio TTFP", sel=VLLM, exemplar=False), "s"), w=8)
    L.add(timeseries("vLLM-Omni: audio real-time factor p50 / p99",
                     "Generation time / audio duration; streaming needs < 1.",
                     quantiles("vllm_omni:audio_rtf", "", "RTF", sel=VLLM, exemplar=False), "none",
                     thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]), w=8)
    L.add(timeseries("vLLM-Omni: requests running / waiting",
                     "Pipeline-wide (vllm_omni:num_requests_*) and per stage (vllm:num_requests_*, "
                     "stage = vLLM-Omni's stage label).", [
                         prom(f"sum(vllm_omni:num_requests_running{{{VLLM}}})", "running"),
                         prom(f"sum(vllm_omni:num_requests_waiting{{{VLLM}}})", "waiting"),
                         prom(named(f"sum by (stage) (vllm:num_requests_waiting{{{VLLM}}})"),
                              "waiting {{stage_name}} (stage {{stage}})"),
                     ], "short"), w=8)
    L.add(timeseries("vLLM-Omni: transfer tx / rx / in flight p99 per stage pair",
                     "vllm_omni:transfer_{tx,rx,in_flight}_s.",
                     [t for m, n in (("tx", "tx"), ("rx", "rx"), ("in_flight", "in flight"))
                      for t in quantiles(f"vllm_omni:transfer_{m}_s", "from_stage, to_stage",
                                         f"{n} {{{{from_name}}}}->{{{{to_name}}}} ({{{{from_stage}}}}->{{{{to_stage}}}})",
                                         sel=VLLM, qs=(0.99,),
                                         exemplar=False)], "s"), w=12)
    L.add(timeseries("vLLM-Omni: transfer bytes per second per stage pair",
                     "vllm_omni:transfer_size_bytes.",
                     [prom(pair_named(f"sum by (from_stage, to_stage) (rate(vllm_omni:transfer_size_bytes_sum"
                                      f"{{{VLLM}}}{RI}))"),
                           "{{from_name}}->{{to_name}} ({{from_stage}}->{{to_stage}})")], "Bps"), w=12)

    return dashboard("omnitrace-overview", "omnitrace / Load test overview",
                     "A load test live: request rate, TTFP/TTFT, where TTFP goes per stage and cause, "
                     "FIFO residence and head-of-line blocking, snapshot and transfer costs, "
                     "and omnitrace's own drops, lag and exporter loss.",
                     [ds_var("datasource", "Prometheus", "prometheus"), RUN_VAR, STAGE_VAR, REPLICA_VAR,
                      FIFO_STAGE_VAR, VLLM_VAR],
                     L.panels, [_link("Request trace", "omnitrace-request")])


# --------------------------------------------------------------------------- request
REQUEST_HELP = """\
**One request's trace.** Paste its **trace id** (a histogram exemplar on the overview opens
this dashboard with it filled in; the trace id is the first 16 bytes of SHA-256 of the
request id, `omnitrace.conventions.trace_id_for`), or its **request id** (the `x-request-id`
the client sent) to search for it: Tempo by TraceQL on `omni.request.id`, Jaeger by tag.
The root span is `omni.request`; its children are the stages, their queues, and each chunk's
snapshot, FIFO, process, put, poll lag, get and wait-for-schedule spans.
Beside it: where TTFP went for the run's requests, for comparison."""


def request() -> Json:
    L = Layout()
    L.add(text("How to open a request", REQUEST_HELP), w=24, h=5)
    L.add(trace_table("Traces of request $request_id (Tempo, TraceQL)",
                      "Search on the request id attribute of the root span.", TEMPO,
                      {"queryType": "traceql", "limit": 20, "tableType": "traces",
                       "query": '{ span.omni.request.id = "$request_id" && name = "omni.request" }'}), w=12)
    L.add(trace_table("Traces of request $request_id (Jaeger search)", "Search by tag on the omnitrace service.",
                      JAEGER, {"queryType": "search", "service": "omnitrace",
                               "operation": "omni.request", "tags": "omni.request.id=$request_id",
                               "limit": 20}), w=12)
    L.add(traces("Trace (Jaeger)", "The trace with id $trace_id from Jaeger.", JAEGER,
                 {"query": "$trace_id"}), w=15, h=16)
    L.add(bargauge("The run's TTFP attribution (mean seconds per request)",
                   "Where TTFP went for the run's completed requests (live), to compare with the trace.",
                   [prom(attribution(), "{{stage_name}} ({{stage}}) {{category}}")], "s"), w=9, h=16)
    L.add(traces("Trace (Tempo)", "The trace with id $trace_id from Tempo.", TEMPO,
                 {"queryType": "traceql", "query": "$trace_id", "limit": 20}), w=15, h=16)
    L.add(timeseries("The run's TTFP p50 / p99",
                     "Exemplars (dots) are other requests' traces: click one to open it.",
                     quantiles("omnitrace_request_ttfp_seconds", "", "TTFP", sel=RUN), "s"), w=9, h=16)
    return dashboard("omnitrace-request", "omnitrace / Request trace",
                     "One request's trace across stages (Jaeger or Tempo) beside the run's live TTFP "
                     "attribution.",
                     [ds_var("datasource", "Prometheus", "prometheus"), ds_var("jaeger", "Jaeger", "jaeger"),
                      ds_var("tempo", "Tempo", "tempo"), RUN_VAR, STAGE_VAR,
                      textbox("trace_id", "Trace id", "32 hex digits"),
                      textbox("request_id", "Request id", "the x-request-id the client sent")],
                     L.panels, [_link("Load test overview", "omnitrace-overview")])


DASHBOARDS = {"omnitrace-overview.json": overview, "omnitrace-request.json": request}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text_ in render().items():
        path = os.path.join(OUT, name)
        try:
            with open(path) as f:
                same = f.read() == text_
        except FileNotFoundError:
            same = False
        if same:
            continue
        stale.append(name)
        if not check:
            os.makedirs(OUT, exist_ok=True)
            with open(path, "w") as f:
                f.write(text_)
    if check and stale:
        print(f"dashboards out of date: {', '.join(stale)} (run python dashboards/generate.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
