"""One request's waterfall as a plotly figure (data: omnitrace.analyze.waterfall).

Rows, top to bottom: the critical path (coloured by category), then per stage its spans
(one row per span kind; spans on the critical path solid with a dark outline, the rest
faded), and under each stage that has a FIFO, the tasks of OTHER requests its sender was
busy with while this request's chunks waited (hover names the request).
"""
from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from omnitrace.categories import DESCRIPTIONS

_KINDS = ("stage", "queue", "snapshot", "fifo", "process", "put", "poll_lag", "get", "wait_schedule")
_KIND_COLORS = {"stage": "#c7c7c7", "queue": "#8c564b", "snapshot": "#ff7f0e", "fifo": "#d62728",
                "process": "#9467bd", "put": "#2ca02c", "poll_lag": "#bcbd22", "get": "#98df8a",
                "wait_schedule": "#17becf"}
PATH_ROW = "critical path"


def _stage_key(label: str) -> tuple[int, str]:
    head = label.split(":", 1)[0]
    return (int(head) if head.lstrip("-").isdigit() else 999, label)


def figure(wf: dict[str, Any], colors: dict[str, str]) -> go.Figure:
    stages = sorted({s[0] for s in wf["spans"]} | {w["stage"] for w in wf["waits"]}, key=_stage_key)
    rows: list[str] = [PATH_ROW]
    for st in stages:
        kinds = {s[1] for s in wf["spans"] if s[0] == st}
        rows += [f"{st} {k}" for k in _KINDS if k in kinds]
        if any(w["busy"] for w in wf["waits"] if w["stage"] == st):
            rows.append(f"{st} sender busy (other requests)")
    fig = go.Figure()
    for cat in DESCRIPTIONS:  # the critical path, one trace per category
        segs = [p for p in wf["path"] if p[3] == cat]
        if segs:
            fig.add_bar(y=[PATH_ROW] * len(segs), x=[p[1] for p in segs], base=[p[0] for p in segs],
                        orientation="h", name=cat, legendgroup="path", marker_color=colors.get(cat),
                        customdata=[[p[2], DESCRIPTIONS[cat]] for p in segs],
                        hovertemplate=(f"<b>{cat}</b> (%{{customdata[0]}})<br>%{{customdata[1]}}<br>"
                                       "from %{base:.3f} ms, %{x:.3f} ms<extra>critical path</extra>"))
    for kind in _KINDS:
        for on_path in (True, False):
            sp = [s for s in wf["spans"] if s[1] == kind and bool(s[5]) == on_path]
            if not sp:
                continue
            fig.add_bar(y=[f"{s[0]} {kind}" for s in sp], x=[max(s[4] - s[3], 0.0) for s in sp],
                        base=[s[3] for s in sp], orientation="h", showlegend=False,
                        marker=dict(color=_KIND_COLORS[kind], opacity=1.0 if on_path else 0.35,
                                    line=dict(color="#000" if on_path else _KIND_COLORS[kind],
                                              width=1.5 if on_path else 0)),
                        customdata=[[s[2], "on the critical path" if on_path else "off the path",
                                     " (no end event)" if s[6] else ""] for s in sp],
                        hovertemplate=(f"{kind} chunk %{{customdata[0]}}: %{{customdata[1]}}"
                                       "%{customdata[2]}<br>from %{base:.3f} ms, %{x:.3f} ms<extra></extra>"))
    busy = [(w["stage"], b, w) for w in wf["waits"] for b in w["busy"]]
    if busy:
        fig.add_bar(y=[f"{st} sender busy (other requests)" for st, _, _ in busy],
                    x=[b[1] - b[0] for _, b, _ in busy], base=[b[0] for _, b, _ in busy],
                    orientation="h", name="sender busy with another request", showlegend=True,
                    marker=dict(color="#555", opacity=0.8, line=dict(color="#fff", width=0.5)),
                    customdata=[[html.escape(b[2]), w["chunk"], "on" if w["on_path"] else "off"]
                                for _, b, w in busy],
                    hovertemplate=("sender busy with <b>%{customdata[0]}</b><br>while this request's "
                                   "chunk %{customdata[1]} waited (%{customdata[2]} the critical path)"
                                   "<br>from %{base:.3f} ms, %{x:.3f} ms<extra></extra>"))
    fig.update_layout(
        barmode="overlay", height=max(320, 90 + 26 * len(rows)),
        title=f"Request {html.escape(wf['id'])}: arrival to first packet ({wf['ttfp_ms']:.1f} ms)",
        xaxis=dict(title="ms since the request arrived", range=[0, wf["ttfp_ms"] * 1.02]),
        yaxis=dict(categoryorder="array", categoryarray=list(reversed(rows)), automargin=True),
        legend=dict(title="critical path"))
    return fig
