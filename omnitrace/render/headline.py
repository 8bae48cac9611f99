"""The answer first: the three lines every face of a report opens with (the console's
header, the HTML page's first screen), from the report dict alone.

1. the requests: measured, attributed, failed, without a first packet; and what of the
   events the hook sites wrote is not in the record (the accounting identity);
2. TTFP p50 and p99, as the server saw it and, where a bench recorded it, the client;
3. the three largest causes of TTFP (stage and category) with their share of it.
"""
from __future__ import annotations

from typing import Any

TOP_CAUSES = 3


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def requests_line(rep: dict[str, Any]) -> str:
    w, rec = rep["window"], rep["recorder"]
    parts = [f"{w['measured']} requests measured", f"{w['attributed']} attributed",
             f"{w.get('failed', 0)} failed"]
    if w.get("no_first_packet"):
        parts.append(f"{w['no_first_packet']} without a first audio packet")
    acc = rec.get("accounting") or {}
    if acc.get("known"):
        missing = acc["events_written"] - acc["recorded"]
        lost = ("all events recorded" if missing <= 0 else
                f"{missing} of {acc['events_written']} events not in the record")
    elif rec.get("dropped"):
        lost = f"{rec['dropped']} events dropped"
    else:
        lost = "events: not accounted for (no agent counters)"
    return ", ".join(parts) + "; " + lost


def ttfp_line(rep: dict[str, Any]) -> str:
    s, c = rep["ttfp"]["server_ms"], rep["ttfp"]["client_ms"]
    if not s["count"]:
        return "TTFP: no measured request got a first audio packet"
    line = f"TTFP p50 {_ms(s['p50'])}, p99 {_ms(s['p99'])} (server)"
    if c["count"]:
        line += f"; client p50 {_ms(c['p50'])}, p99 {_ms(c['p99'])}"
    return line


def top_causes(rep: dict[str, Any], n: int = TOP_CAUSES) -> list[dict[str, Any]]:
    """The ``n`` attribution rows with the largest share of TTFP."""
    return sorted(rep["attribution"], key=lambda a: -a["share"])[:n]


def causes_line(rep: dict[str, Any]) -> str:
    top = top_causes(rep)
    if not top:
        return "Where TTFP went: nothing attributed"
    return "Where TTFP went: " + ", ".join(
        f"{a['share']:.1%} {a['stage'].split(':', 1)[-1]} {a['category']}" for a in top)


def headline(rep: dict[str, Any]) -> list[str]:
    return [requests_line(rep), ttfp_line(rep), causes_line(rep)]
