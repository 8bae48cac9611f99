"""The report's side of head-of-line blocking: the sender timelines of several run
directories of one deployment as one (the rule: :mod:`omnitrace.rules.headofline`)."""
from __future__ import annotations

from omnitrace.rules.headofline import Busy, busy_of


def merged_busy(a: Busy, b: Busy) -> Busy:
    """Two :data:`Busy` maps as one (several run directories of one deployment)."""
    return busy_of([*a.items(), *b.items()])
