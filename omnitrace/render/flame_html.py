"""The HTML report's flame-graph section, for runs recorded with `omnitrace run --flame`:
the graphs ``omnitrace.profile.flamegraphs.gather`` collected (one per profiled process,
one per top TTFP category), all inline SVG: the page shows them offline, with nothing to
fetch. Profiles that are missing are listed with why. Reads no file.
"""
from __future__ import annotations

import html
import os
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from omnitrace.profile.flamegraphs import RunFlames


def _run_html(rf: "RunFlames") -> list[str]:
    e = html.escape
    label = e(os.path.basename(os.path.normpath(rf.path)))
    parts = [f"<p>{label}: py-spy {rf.rate} Hz, {e(rf.mode)}, window {e(rf.window)}; "
             f"<code>omnitrace flame {e(rf.path)} --stage S --category C</code> for any other selection.</p>"]
    parts += [f'<div class="warn">flame graph missing: {e(str(m.get("name")))} '
              f'(pid {m.get("pid")}): {e(str(m.get("reason")))}</div>' for m in rf.missing]
    parts += [f'<div class="warn">{e(name)}: {e(note)}</div>' for name, note in rf.notes]
    parts += [f'<div class="plot flame" id="flame-{e(name)}">{svg}</div>' for name, svg in rf.processes]
    if rf.error:
        parts.append(f'<div class="warn">span-linked flame graphs not drawn: {e(rf.error)}</div>')
    parts += [f'<div class="plot flame">{g}</div>' for g in rf.categories]
    return parts


def flame_section(runs: Sequence["RunFlames"]) -> str:
    """The section's HTML, or "" when no run of the report has profiles."""
    parts = [p for rf in runs for p in _run_html(rf)]
    if not parts:
        return ""
    return ('<section id="flame"><h2>Flame graphs</h2><p>Per process (all its threads, by '
            "time) and, for the top TTFP categories, the samples taken on the thread that did "
            "the work while those spans were open. Hover a frame for its time.</p>"
            + "".join(parts) + "</section>")
