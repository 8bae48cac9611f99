"""Which requests a report measures when the client was not `omnitrace bench` (no
bench.json), or to narrow a bench run further: an id prefix, a time window, and warm-up
excluded by count."""
from __future__ import annotations

from dataclasses import dataclass


class SelectionError(ValueError):
    """A selector the user gave that cannot be used (one line for the user)."""


@dataclass
class Selection:
    prefix: str | None = None  # request ids starting with this
    window_s: tuple[float | None, float | None] | None = None  # seconds after the first arrival
    warmup: int = 0  # the first N requests (by arrival) are warm-up

    @property
    def active(self) -> bool:
        return bool(self.prefix or self.window_s or self.warmup)

    def describe(self) -> str:
        parts = []
        if self.prefix:
            parts.append(f"ids starting {self.prefix!r}")
        if self.window_s:
            lo, hi = self.window_s
            parts.append(f"arrivals {'' if lo is None else f'{lo:g}'}..{'' if hi is None else f'{hi:g}'} s "
                         "after the first")
        if self.warmup:
            parts.append(f"first {self.warmup} excluded as warm-up")
        return ", ".join(parts)

    def apply(self, first_seen: dict[str, int]) -> set[str]:
        """Requests (id -> first unix ns seen) this selection keeps."""
        ids = [r for r in first_seen if not self.prefix or r.startswith(self.prefix)]
        ids.sort(key=lambda r: (first_seen[r], r))
        if self.window_s and ids:
            t0 = first_seen[ids[0]]
            lo, hi = self.window_s
            ids = [r for r in ids if (lo is None or first_seen[r] - t0 >= lo * 1e9)
                   and (hi is None or first_seen[r] - t0 <= hi * 1e9)]
        return set(ids[self.warmup:])


def parse_window(text: str) -> tuple[float | None, float | None]:
    """``START:END`` in seconds after the first arrival; either side may be empty."""
    lo_s, sep, hi_s = text.partition(":")
    try:
        if not sep:
            raise ValueError
        lo = float(lo_s) if lo_s.strip() else None
        hi = float(hi_s) if hi_s.strip() else None
    except ValueError:
        raise SelectionError(f"--window: START:END in seconds expected (e.g. 10:70 or 10:), got {text!r}") from None
    if lo is not None and hi is not None and hi <= lo:
        raise SelectionError(f"--window: END must be after START, got {text!r}")
    if (lo is not None and lo < 0) or (hi is not None and hi < 0):
        raise SelectionError(f"--window: seconds must not be negative, got {text!r}")
    return lo, hi
