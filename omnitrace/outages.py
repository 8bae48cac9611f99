"""When something the agent writes to was out of service (the event log's disk, an OTLP
backend): the intervals, in unix ns, with what was not delivered in each, for the run's
files (agent.json) and the report, which names each outage with its times."""
from __future__ import annotations

import time

MAX_KEPT = 100  # outages kept (the first ones, then the latest): a flapping backend is bounded


class Outages:
    def __init__(self) -> None:
        self.spans: list[list] = []  # [down_unix_ns, up_unix_ns or None (still down), lost]

    @property
    def down(self) -> bool:
        return bool(self.spans) and self.spans[-1][1] is None

    def failed(self, lost: int = 0) -> None:
        if not self.down:
            if len(self.spans) >= MAX_KEPT:
                del self.spans[MAX_KEPT // 2]
            self.spans.append([time.time_ns(), None, 0])
        self.spans[-1][2] += lost

    def ok(self) -> None:
        if self.down:
            self.spans[-1][1] = time.time_ns()

    def to_list(self) -> list[list]:
        return [list(s) for s in self.spans]


def describe(spans: object, start_unix_ns: int | None, unit: str) -> str:
    """'from 61.2 s to 92.0 s into the run (1234 events), ...' for an ``Outages`` list read
    back from a run's files ('' if none or malformed)."""
    if not isinstance(spans, list):
        return ""
    parts = []
    for s in spans:
        if not (isinstance(s, list) and len(s) == 3 and isinstance(s[0], int)):
            continue
        at = (lambda t: f"{(t - start_unix_ns) / 1e9:.1f} s") if isinstance(start_unix_ns, int) else (
            lambda t: time.strftime("%H:%M:%S", time.localtime(t / 1e9)))
        end = f"to {at(s[1])}" if isinstance(s[1], int) else "to the end"
        parts.append(f"from {at(s[0])} {end} ({s[2]} {unit})")
    if not parts:
        return ""
    return ", ".join(parts) + (" into the run" if isinstance(start_unix_ns, int) else "")
