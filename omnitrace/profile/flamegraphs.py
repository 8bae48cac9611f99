"""The HTML report's flame graphs, gathered for the renderer (``render/flame_html.py``
turns them into HTML and reads no file): per profiled process the SVG that
``omnitrace run --flame`` left in ``profiles/``, and per top TTFP category (the categories
with the largest mean, each at the stage that spends most in it) the samples on the
working thread inside that category's spans (``omnitrace.profile.linked``). Profiles that
are missing are listed with why.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


from omnitrace.profile import linked, render
from omnitrace.profile.store import collapsed
from omnitrace.runfiles import names
from omnitrace.runfiles.read import read_profiles_index

TOP_CATEGORIES = 3


@dataclass
class RunFlames:
    """One run directory's flame graphs, as the report shows them."""

    path: str
    rate: Any = None  # py-spy's rate, Hz
    mode: str = ""
    window: str = ""
    missing: list[dict] = field(default_factory=list)  # {name, pid, reason}
    notes: list[tuple[str, str]] = field(default_factory=list)  # (profile, note)
    processes: list[tuple[str, str]] = field(default_factory=list)  # (profile, SVG)
    categories: list[str] = field(default_factory=list)  # SVGs, span-linked
    error: str = ""  # why the span-linked graphs are not drawn


def gather(rep: dict[str, Any]) -> list[RunFlames]:
    """The flame graphs of every run of ``rep`` recorded with profiles."""
    out = []
    for run in rep.get("runs") or ():
        path = run.get("path") or ""
        index = read_profiles_index(path)
        if index is None:
            continue
        rf = RunFlames(path, index.get("rate"), str(index.get("mode")), str(index.get("window")),
                       list(index.get("missing") or ()))
        for p in index.get("profiles") or ():
            if p.get("note"):
                rf.notes.append((p["name"], p["note"]))
            svg = _read(os.path.join(path, names.PROFILES, f"{p['name']}.svg"))
            if svg:
                rf.processes.append((p["name"], svg))
        try:
            rf.categories = _category_graphs(path, rep)
        except Exception as exc:  # noqa: BLE001 - the report stands without them
            rf.error = f"{type(exc).__name__}: {exc}"
        out.append(rf)
    return out


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _top_categories(rep: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(category, stage id, stage label) of the categories with the largest mean, each at
    the stage that spends most in it; only categories a thread works in."""
    best: dict[str, tuple[float, str]] = {}
    for a in rep.get("attribution") or ():
        cat, ms = a.get("category"), float(a.get("mean_ms") or 0.0)
        if cat in linked.CATEGORIES and ms > best.get(cat, (0.0, ""))[0]:
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
    cats = _top_categories(rep)
    if not cats:
        return []
    store = linked.profiles_store(run_dir)
    index = linked.open_index(run_dir)
    out = []
    for cat, sid, label in cats:
        iv, _ = linked.intervals(run_dir, cat, str(sid), index=index)
        idx, secs = linked.select_time(store, iv)
        covered_s = linked.covered_ns(iv) / 1e9
        sub = linked.selection_title(secs, covered_s, iv.spans, 1e9 / store.period_ns,
                                     linked.unsampled_ns(store, iv) / 1e9)
        out.append(render.svg(collapsed(store, idx, linked.exact_split(secs, covered_s)), f"{label} {cat}", sub))
    return out
