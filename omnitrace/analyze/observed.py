"""Categories a path never shows: a hop kind whose span was missing on EVERY critical-path
hop of a stage pair was not observed there (its hook does not fire on the path the
requests took: another runner, connector or release), which a mean of 0 ms would hide.
Said by name, per stage, in the report (``not_observed``) and its warnings."""
from __future__ import annotations

import re
from collections import Counter
from itertools import chain
from typing import Any, Callable

from omnitrace import conventions as cv
from omnitrace.rules import attribution as at

_HOP = re.compile(r"^(?P<span>[a-z_.]+)\[(?P<p>-?\d+)->(?P<c>-?\d+)#-?\d+\]$")
# the walk's missing-span names -> (categories they would have given, producer side?)
_CATEGORIES = {cv.SPAN_SNAPSHOT: ((at.SNAPSHOT,), True), cv.SPAN_FIFO: ((at.FIFO_BLOCKED, at.FIFO_OWN), True),
               cv.SPAN_PROCESS: ((at.PROCESS,), True), cv.SPAN_PUT: ((at.PUT,), True),
               cv.SPAN_GET: ((at.GET,), False), cv.SPAN_POLL: ((at.POLL_LAG,), False)}


def not_observed(requests: list[dict[str, Any]], label: Callable[[int], str]) -> list[dict[str, Any]]:
    """From the attributed rows' ``hops`` and ``missing_spans``: each (stage, category) whose
    span no hop of its stage pair had."""
    # each distinct name parsed once (a long run's rows repeat a few hop names millions of times)
    hops: dict[tuple[int, int], int] = {}
    for h, n in Counter(chain.from_iterable(r["hops"] for r in requests)).items():
        p, c = (int(x) for x in h.split("#")[0].split("->"))
        hops[(p, c)] = hops.get((p, c), 0) + n
    missing: dict[tuple[str, int, int], int] = {}
    for m, n in Counter(chain.from_iterable(r["missing_spans"] for r in requests)).items():
        g = _HOP.match(m)
        if g and g["span"] in _CATEGORIES:
            k = (g["span"], int(g["p"]), int(g["c"]))
            missing[k] = missing.get(k, 0) + n
    out = []
    for (span, p, c), n in sorted(missing.items(), key=lambda x: (x[0][1], x[0][2], x[0][0])):
        if n < hops.get((p, c), 0):
            continue  # seen on some hops: a gap, listed per request, not the path's
        cats, producer = _CATEGORIES[span]
        stage = p if producer else c
        out += [{"stage": label(stage), "stage_id": stage, "category": cat, "span": span,
                 "hops": n, "pair": f"{p}->{c}"} for cat in cats]
    return out


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """The warning: one line naming every category not observed."""
    if not rows:
        return []
    what = sorted({f"{r['stage']} {r['category']} ({r['span']}, {r['hops']} hops {r['pair']})" for r in rows})
    return ["not observed on this path (no hop had the span: its hook does not fire here; not "
            "0 ms): " + "; ".join(what)]
