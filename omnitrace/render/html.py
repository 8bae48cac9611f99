"""Self-contained interactive HTML report (plotly, with plotly.js inlined: works offline)."""
from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from omnitrace.analyze.attribution import CATEGORIES
from omnitrace.render.console import render as render_text

# One colour per category, the same in every plot.
COLORS = dict(zip(CATEGORIES, ("#393b79", "#6b6ecf", "#8c564b", "#17becf", "#1f77b4", "#ff7f0e",
                               "#d62728", "#e377c2", "#9467bd", "#2ca02c", "#bcbd22", "#98df8a",
                               "#637939", "#e7ba52", "#ad494a", "#c7c7c7")))
HEATMAP_TOP = 30


def _attribution_fig(rep: dict[str, Any]) -> go.Figure:
    stages = list(dict.fromkeys(a["stage"] for a in rep["attribution"]))
    fig = go.Figure()
    for cat in CATEGORIES:
        vals = {a["stage"]: a["mean_ms"] for a in rep["attribution"] if a["category"] == cat}
        if vals:
            fig.add_bar(name=cat, x=stages, y=[vals.get(s, 0.0) for s in stages],
                        marker_color=COLORS[cat],
                        hovertemplate="%{x} " + cat + ": %{y:.3f} ms<extra></extra>")
    fig.update_layout(barmode="stack", title="Mean TTFP attribution per stage (ms; bars sum to mean TTFP)",
                      yaxis_title="ms", xaxis_title="stage")
    return fig


def _residence_fig(rep: dict[str, Any]) -> go.Figure:
    fig = go.Figure()
    for f in rep["fifo"]:
        fig.add_histogram(x=f["residence_ms"], name=f"stage {f['stage']}", opacity=0.65, nbinsx=60)
    # Log count axis: residence is heavy-tailed and the tail is what matters.
    fig.update_layout(barmode="overlay", title="FIFO residence per producer stage (log count)",
                      xaxis_title="residence (ms)", yaxis_title="chunks", yaxis_type="log")
    return fig


def _hol_fig(rep: dict[str, Any]) -> go.Figure:
    rows = rep["head_of_line"]
    victims: dict[str, float] = {}
    culprits: dict[str, float] = {}
    for r in rows:
        victims[r["victim"]] = victims.get(r["victim"], 0.0) + r["blocked_ms"]
        culprits[r["culprit"]] = culprits.get(r["culprit"], 0.0) + r["blocked_ms"]
    vs = sorted(victims, key=lambda k: -victims[k])[:HEATMAP_TOP]
    cs = sorted(culprits, key=lambda k: -culprits[k])[:HEATMAP_TOP]
    vi, ci = {v: i for i, v in enumerate(vs)}, {c: i for i, c in enumerate(cs)}
    z = [[0.0] * len(cs) for _ in vs]
    for r in rows:
        if r["victim"] in vi and r["culprit"] in ci:
            z[vi[r["victim"]]][ci[r["culprit"]]] += r["blocked_ms"]
    fig = go.Figure(go.Heatmap(z=z, x=cs, y=vs, colorscale="Reds", colorbar_title="ms",
                               hovertemplate="victim %{y}<br>culprit %{x}<br>%{z:.3f} ms<extra></extra>"))
    fig.update_layout(title=f"Head-of-line blocking: victim x culprit (top {HEATMAP_TOP}, ms)",
                      xaxis_title="culprit (task ahead in the FIFO)", yaxis_title="victim")
    return fig


def _waterfall_fig(rep: dict[str, Any], n: int = 10) -> go.Figure:
    reqs = [r for r in rep["requests"] if r.get("segments")][:n]
    fig = go.Figure()
    seen: set[str] = set()
    for r in reversed(reqs):
        for start, dur, stage, cat, detail in r["segments"]:
            fig.add_bar(y=[r["id"]], x=[dur], base=[start], orientation="h", name=cat,
                        legendgroup=cat, showlegend=cat not in seen, marker_color=COLORS.get(cat),
                        hovertemplate=(f"{html.escape(r['id'])}<br>stage {stage} {cat} {detail}<br>"
                                       "start %{base:.3f} ms, %{x:.3f} ms<extra></extra>"))
            seen.add(cat)
    fig.update_layout(barmode="overlay", title=f"Critical path of the {len(reqs)} slowest requests "
                      "(ms from arrival to first audio packet)", xaxis_title="ms since arrival",
                      height=max(350, 60 + 40 * len(reqs)))
    return fig


def figures(rep: dict[str, Any]) -> list[tuple[str, go.Figure | None]]:
    """(id, figure or None when there is no data for it)."""
    return [
        ("attribution", _attribution_fig(rep) if rep["attribution"] else None),
        ("residence", _residence_fig(rep) if rep["fifo"] else None),
        ("hol", _hol_fig(rep) if rep["head_of_line"] else None),
        ("waterfall", _waterfall_fig(rep) if rep["requests"] else None),
    ]


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.warn{background:#fff3cd;border:1px solid #e0b000;padding:.6em;margin:.3em 0}
.drop{background:#f8d7da;border:1px solid #c00;padding:.6em;font-weight:bold}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}
.plot{margin:1em 0;border:1px solid #ddd}.empty{color:#777;font-style:italic}"""


def to_html(rep: dict[str, Any]) -> str:
    parts: list[str] = []
    first = True
    for fid, fig in figures(rep):
        if fig is None:
            parts.append(f'<div class="empty" id="{fid}">no data for {fid}</div>')
            continue
        fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=50, b=50))
        parts.append('<div class="plot">' + pio.to_html(
            fig, full_html=False, include_plotlyjs=first, div_id=fid,
            config={"displaylogo": False, "responsive": True}) + "</div>")
        first = False
    if first:  # no figure at all: still ship nothing external
        parts.append('<div class="empty">nothing to plot: no measured request was attributed</div>')
    banners = []
    if rep["recorder"]["dropped"]:
        banners.append(f'<div class="drop">The recorder dropped {rep["recorder"]["dropped"]} events '
                       "in this run: affected requests are attributed from incomplete spans.</div>")
    banners += [f'<div class="warn">{html.escape(w)}</div>' for w in rep["warnings"]]
    run_ids = ", ".join(str(r.get("run_id")) for r in rep["run"]) or "unknown run"
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>omnitrace report {html.escape(run_ids)}</title><style>{_CSS}</style></head><body>"
            f"<h1>omnitrace report: {html.escape(run_ids)}</h1>" + "".join(banners)
            + "".join(parts) + "<h2>Tables</h2><pre>" + html.escape(render_text(rep, limit=50))
            + "</pre></body></html>")


def write_html(rep: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_html(rep))
