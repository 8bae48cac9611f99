"""Self-contained interactive HTML report (plotly, with plotly.js inlined: works offline)."""
from __future__ import annotations

import html
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from omnitrace.categories import CATEGORIES, COLORS, DESCRIPTIONS
from omnitrace.render import waterfall_fig
from omnitrace.render.console import render as render_text
from omnitrace.render.flame_html import flame_section
from omnitrace.render.headline import headline

HEATMAP_TOP = 30
# Stages told apart by bar pattern where colour already means the category.
PATTERNS = ("", "/", "x", ".", "\\", "+", "-", "|")


def _pattern(stage: str, stages: list[str]) -> str:
    return PATTERNS[stages.index(stage) % len(PATTERNS)] if stage in stages else ""


def _attribution_fig(rep: dict[str, Any]) -> go.Figure:
    stages = list(dict.fromkeys(a["stage"] for a in rep["attribution"]))
    fig = go.Figure()
    for cat in CATEGORIES:
        vals = {a["stage"]: a["mean_ms"] for a in rep["attribution"] if a["category"] == cat}
        if vals:
            fig.add_bar(name=cat, x=stages, y=[vals.get(s, 0.0) for s in stages],
                        marker_color=COLORS[cat],
                        hovertemplate=("%{x} <b>" + cat + "</b>: %{y:.3f} ms<br>"
                                       + html.escape(DESCRIPTIONS[cat]) + "<extra></extra>"))
    fig.update_layout(barmode="stack", title="Mean TTFP attribution per stage (ms; bars sum to mean TTFP)",
                      yaxis_title="ms", xaxis_title="stage")
    return fig


def _residence_fig(rep: dict[str, Any]) -> go.Figure:
    """Heavy-tailed, over decades: log-spaced bins, the SAME bins for every stage (the
    report's fixed histogram), and each stage's share of its chunks per bin (so stages with
    different chunk counts compare); the empty decades at either end are not drawn."""
    fig = go.Figure()
    hists = [(f, np.asarray(f["residence_hist"]["counts"], np.float64)) for f in rep["fifo"]]
    if not hists:
        return fig
    edges = np.asarray(rep["fifo"][0]["residence_hist"]["edges_ms"], np.float64)
    inner = np.sum([c[1:-1] for _, c in hists], axis=0)  # counts[0] / [-1]: outside the edges
    used = np.flatnonzero(inner)
    if not len(used):
        return fig
    lo, hi = max(0, used[0] - used[0] % 8), min(len(inner), used[-1] + 8 - used[-1] % 8)
    for f, counts in hists:
        share = counts[1:-1][lo:hi] / max(counts.sum(), 1) * 100
        fig.add_scatter(x=edges[lo:hi + 1], y=np.append(share, share[-1]), mode="lines", line_shape="hv",
                        name=f"stage {f['stage']} ({int(counts.sum())} chunks)", fill="tozeroy",
                        opacity=0.6, hovertemplate="from %{x:.3g} ms: %{y:.1f}% of chunks<extra></extra>")
    ticks = [float(t) for t in edges[lo:hi + 1:8]]
    fig.update_layout(title="FIFO residence per producer stage (same log-spaced bins for every stage)",
                      xaxis=dict(title="residence (ms, log scale)", type="log", tickvals=ticks,
                                 ticktext=[f"{t:g}" for t in ticks]),
                      yaxis_title="% of the stage's chunks")
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
                               hovertemplate=("victim %{y}<br>culprit %{x}<br>%{z:.3f} ms before the "
                                              "victim's first packet<extra></extra>")))
    fig.update_layout(title=f"Head-of-line blocking before the first packet, wall time (ms; top "
                            f"{HEATMAP_TOP} victims x culprits; never more than the victim's TTFP)",
                      xaxis_title="culprit (its task kept the sender busy)", yaxis_title="victim")
    return fig


def _waterfall_fig(rep: dict[str, Any], n: int = 10) -> go.Figure:
    """The slowest requests' critical paths: colour = category, pattern = stage."""
    reqs = [r for r in rep["requests"] if r.get("segments")][:n]
    stages = list(dict.fromkeys(seg[2] for r in reqs for seg in r["segments"]))
    groups: dict[tuple[str, str], list] = {}
    for r in reversed(reqs):
        for start, dur, stage, cat, detail in r["segments"]:
            groups.setdefault((stage, cat), []).append((r["id"], start, dur, detail))
    fig = go.Figure()
    for (stage, cat), bars in sorted(groups.items(), key=lambda kv: (stages.index(kv[0][0]),
                                                                      CATEGORIES.index(kv[0][1]))):
        fig.add_bar(y=[b[0] for b in bars], x=[b[2] for b in bars], base=[b[1] for b in bars],
                    orientation="h", name=f"{stage} {cat}", legendgroup=stage,
                    legendgrouptitle_text=f"stage {stage}",
                    marker=dict(color=COLORS.get(cat), pattern_shape=_pattern(stage, stages),
                                line=dict(color="#333", width=0.5)),
                    customdata=[[b[3], DESCRIPTIONS.get(cat, "")] for b in bars],
                    hovertemplate=(f"%{{y}}<br><b>{html.escape(stage)} {cat}</b> %{{customdata[0]}}<br>"
                                   "%{customdata[1]}<br>start %{base:.3f} ms, %{x:.3f} ms<extra></extra>"))
    fig.update_layout(barmode="overlay", title=f"Critical path of the {len(reqs)} slowest requests "
                      "(colour = category, pattern = stage; ms from arrival to first audio packet)",
                      xaxis_title="ms since arrival", yaxis=dict(automargin=True),
                      height=max(350, 60 + 40 * len(reqs)))
    return fig


def _legend_html(rep: dict[str, Any]) -> str:
    """Every category the report uses, with its colour and one-line meaning."""
    used = {a["category"] for a in rep["attribution"]}
    items = "".join(f'<dt><span class="sw" style="background:{COLORS.get(c["category"], "#999")}">'
                    f'</span>{html.escape(c["category"])}</dt><dd>{html.escape(c["description"])}</dd>'
                    for c in rep.get("categories", []) if c["category"] in used)
    return f'<dl class="legend" id="legend">{items}</dl>' if items else ""


def _headline_html(rep: dict[str, Any]) -> str:
    """The answer on the first screen: requests and losses, TTFP, the top causes."""
    return '<div class="headline" id="headline">' + "".join(
        f"<p>{html.escape(line)}</p>" for line in headline(rep)) + "</div>"


def figures(rep: dict[str, Any]) -> list[tuple[str, go.Figure | None]]:
    """(id, figure or None when there is no data for it)."""
    return [
        ("attribution", _attribution_fig(rep) if rep["attribution"] else None),
        ("residence", _residence_fig(rep) if rep["fifo"] else None),
        ("hol", _hol_fig(rep) if rep["head_of_line"] else None),
        ("waterfall", _waterfall_fig(rep) if rep["requests"] else None),
    ] + [(f"request-{i}", waterfall_fig.figure(wf, COLORS)) for i, wf in enumerate(rep.get("waterfalls", []))]


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.headline{font-size:17px;border-left:4px solid #2a6;padding:.2em .8em;margin:.5em 0 1em}
.headline p{margin:.25em 0}
.warn{background:#fff3cd;border:1px solid #e0b000;padding:.6em;margin:.3em 0}
.drop{background:#f8d7da;border:1px solid #c00;padding:.6em;font-weight:bold}
.acct{color:#444;padding:.2em 0;font-size:90%}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}
.plot{margin:1em 0;border:1px solid #ddd}.empty{color:#777;font-style:italic}
.legend{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;font-size:13px}
.legend dt{font-family:monospace}.legend dd{margin:0}
.sw{display:inline-block;width:.9em;height:.9em;margin-right:.4em;vertical-align:middle}"""


def to_html(rep: dict[str, Any], flames: Sequence[Any] = ()) -> str:
    """The report page; ``flames``: the runs' flame graphs (``profile.flamegraphs.gather``)."""
    parts: list[str] = []
    first = True
    for fid, fig in figures(rep):
        if fig is None:
            parts.append(f'<div class="empty" id="{fid}">no data for {fid}</div>')
            continue
        fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=50, b=50))
        if fid == "request-0":
            parts.append("<h2>Waterfalls: arrival to first packet, per request</h2>")
        parts.append('<div class="plot">' + pio.to_html(
            fig, full_html=False, include_plotlyjs=first, div_id=fid,
            config={"displaylogo": False, "responsive": True}) + "</div>")
        if fid == "attribution":
            parts.append(_legend_html(rep))
        first = False
    if first:  # no figure at all: still ship nothing external
        parts.append('<div class="empty">nothing to plot: no measured request was attributed</div>')
    banners = []
    if rep["recorder"]["dropped"]:
        banners.append(f'<div class="drop">The recorder dropped {rep["recorder"]["dropped"]} events '
                       "in this run: affected requests are attributed from incomplete spans.</div>")
    acc = rep["recorder"].get("accounting")
    if acc:  # the identity, always: a reader sees what share of the events the report holds
        cls = "acct" if acc.get("closes") and not acc.get("lost") else "warn"
        banners.append(f'<div class="{cls}">{html.escape(acc["headline"])}</div>')
    banners += [f'<div class="warn">{html.escape(w)}</div>' for w in rep["warnings"]]
    run_ids = ", ".join(str(r.get("run_id")) for r in rep["run"]) or "unknown run"
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>omnitrace report {html.escape(run_ids)}</title><style>{_CSS}</style></head><body>"
            f"<h1>omnitrace report: {html.escape(run_ids)}</h1>" + _headline_html(rep) + "".join(banners)
            + "".join(parts) + flame_section(flames) + "<h2>Tables</h2><pre>" + html.escape(render_text(rep, limit=50))
            + "</pre></body></html>")


def write_html(rep: dict[str, Any], path: str, flames: Sequence[Any] = ()) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_html(rep, flames))
