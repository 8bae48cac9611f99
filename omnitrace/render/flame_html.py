"""The HTML report's flame-graph section, for runs recorded with `omnitrace run --flame`.

One flame graph per profiled process (the SVGs in ``profiles/``) and one per top TTFP
category (the samples on the working thread inside that category's spans, the stage that
spends most in it; ``omnitrace.profile.linked``), all inline SVG: the page shows them
offline, with nothing to fetch. Profiles that are missing are listed with why.
"""
from __future__ import annotations

import html
import os
from typing import Any

import orjson

TOP_CATEGORIES = 3


def _index(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, "profiles", "index.json"), "rb") as f:
            return orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return None


def _svg(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _top_categories(rep: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(category, stage id, stage label) of the categories with the largest mean, each at
    the stage that spends most in it; only categories a thread works in."""
    from omnitrace.profile.linked import CATEGORIES
    best: dict[str, tuple[float, str]] = {}
    for a in rep.get("attribution") or ():
        cat, ms = a.get("category"), float(a.get("mean_ms") or 0.0)
        if cat in CATEGORIES and ms > best.get(cat, (0.0, ""))[0]:
            best[cat] = (ms, str(a.get("stage")))
    out = []
    for cat, (_, stage) in sorted(best.items(), key=lambda kv: -kv[1][0])[:TOP_CATEGORIES]:
        sid, _, label = stage.partition(":")
        try:
            out.append((cat, int(sid), label or stage))
        except ValueError:
            continue
    return out


def _category_graphs(run_dir: str, rep: dict[str, Any]) -> list[str]:
    from omnitrace.profile import linked, render
    from omnitrace.profile.store import collapsed
    cats = _top_categories(rep)
    if not cats:
        return []
    store = linked.profiles_store(run_dir)
    index = linked.open_index(run_dir)
    out = []
    for cat, sid, label in cats:
        iv, _ = linked.intervals(run_dir, cat, str(sid), index=index)
        idx, secs, sampled = linked.select_time(store, iv)
        sub = (f"{float(secs.sum()):.3f} s in {iv.spans} spans on the working thread, split by "
               f"{len(idx)} samples (py-spy saw {sampled:.3f} s of it)")
        out.append(render.svg(collapsed(store, idx, secs), f"{label} {cat}", sub))
    return out


def flame_section(rep: dict[str, Any]) -> str:
    """The section's HTML, or "" when no run of the report has profiles."""
    parts: list[str] = []
    for run in rep.get("runs") or ():
        path = run.get("path") or ""
        index = _index(path)
        if index is None:
            continue
        label = html.escape(os.path.basename(os.path.normpath(path)))
        parts.append(f"<p>{label}: py-spy {index.get('rate')} Hz, {html.escape(str(index.get('mode')))}, "
                     f"window {html.escape(str(index.get('window')))}; <code>omnitrace flame {html.escape(path)} "
                     "--stage S --category C</code> for any other selection.</p>")
        for m in index.get("missing") or ():
            parts.append(f'<div class="warn">flame graph missing: {html.escape(str(m.get("name")))} '
                         f'(pid {m.get("pid")}): {html.escape(str(m.get("reason")))}</div>')
        for p in index.get("profiles") or ():
            if p.get("note"):
                parts.append(f'<div class="warn">{html.escape(p["name"])}: {html.escape(p["note"])}</div>')
            svg = _svg(os.path.join(path, "profiles", f"{p['name']}.svg"))
            if svg:
                parts.append(f'<div class="plot flame" id="flame-{html.escape(p["name"])}">{svg}</div>')
        try:
            graphs = _category_graphs(path, rep)
        except Exception as exc:  # the report stands without them
            parts.append(f'<div class="warn">span-linked flame graphs not drawn: '
                         f'{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</div>')
            graphs = []
        parts += [f'<div class="plot flame">{g}</div>' for g in graphs]
    if not parts:
        return ""
    return ('<section id="flame"><h2>Flame graphs</h2><p>Per process (all its threads, by '
            "time) and, for the top TTFP categories, the samples taken on the thread that did "
            "the work while those spans were open. Hover a frame for its time.</p>"
            + "".join(parts) + "</section>")
