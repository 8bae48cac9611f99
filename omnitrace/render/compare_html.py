"""The A/B comparison as one self-contained HTML page (``omnitrace loadtest --ab``).

A forest plot: per (stage, category), B − A in ms per request with its bootstrap CI,
significant rows coloured, and the table beside it. Plotly (the report's library) with
plotly.js inlined, so the file opens offline.
"""
from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio


def write_compare_html(res: dict[str, Any], path: str) -> None:
    rows = [r for r in res["rows"] if r["a_ms"] or r["b_ms"]]
    names = ["TTFP" if r["category"] == "ttfp" else f"{r['stage']} {r['category']}" for r in rows]
    delta = [r["delta_ms"] for r in rows]
    fig = go.Figure(go.Scatter(
        x=delta, y=names, mode="markers",
        marker=dict(size=9, color=["#c0392b" if r["significant"] else "#7f8c8d" for r in rows]),
        error_x=dict(type="data", symmetric=False,
                     array=[r["ci_high_ms"] - r["delta_ms"] for r in rows],
                     arrayminus=[r["delta_ms"] - r["ci_low_ms"] for r in rows]),
        hovertemplate="%{y}: %{x:.3f} ms<extra></extra>"))
    fig.add_vline(x=0, line_color="#333")
    fig.update_layout(template="plotly_white", height=120 + 26 * len(rows),
                      title="B − A, ms per request (95% bootstrap CI; red: CI excludes 0)",
                      xaxis_title="ms per request", yaxis=dict(autorange="reversed"),
                      margin=dict(l=200, r=30, t=60, b=50))
    plot = pio.to_html(fig, full_html=False, include_plotlyjs=True, div_id="forest")
    deps = res.get("deployments", {})
    head = "".join(f"<li><b>{k}</b>: <code>{html.escape(' '.join(v) or 'default')}</code> — "
                   f"{len(res[k.lower()])} run(s): {html.escape(', '.join(res[k.lower()]))}</li>"
                   for k, v in deps.items())
    warn = "".join(f"<li>{html.escape(w)}</li>" for w in res.get("warnings", []))
    unfit = ("<p class='unfit'>! A side is not fit to compare (see the warnings): every delta is "
             "marked.</p>" if res.get("unfit") else "")
    cells = "".join(
        f"<tr class='{'sig' if r['significant'] else ''}'><td>{html.escape(n)}"
        f"{' !' if r.get('doubtful') else ''}</td>"
        f"<td>{r['a_ms']:.3f}</td><td>{r['b_ms']:.3f}</td><td>{r['delta_ms']:+.3f}</td>"
        f"<td>[{r['ci_low_ms']:+.3f}, {r['ci_high_ms']:+.3f}]</td></tr>"
        for n, r in zip(names, rows))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>omnitrace A/B comparison</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}
table{{border-collapse:collapse}}td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}}
td:first-child,th:first-child{{text-align:left}}tr.sig td{{color:#c0392b;font-weight:600}}
.unfit,.warnings{{color:#b35900;font-weight:600}}</style>
</head><body><h1>A/B comparison</h1>
<p>Order {html.escape(''.join(res.get('order', [])))}; hierarchical bootstrap ({res['bootstrap']}×: runs, then
requests within each run), {int(res['confidence'] * 100)}% intervals.</p><ul>{head}</ul>
{unfit}<ul class="warnings">{warn}</ul>
{plot}
<table><tr><th>stage / category</th><th>A ms</th><th>B ms</th><th>B − A</th><th>95% CI</th></tr>{cells}</table>
</body></html>"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
