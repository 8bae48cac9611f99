"""The clock thread every process of a `--flame` run runs while py-spy samples it.

py-spy stamps its samples in microseconds since its own start, an instant nothing else can
read. This thread cycles through ``K`` functions with distinct names, holding each for a
random time, and notes when each one began on ``perf_counter_ns`` (CLOCK_MONOTONIC, the
clock of omnitrace's event rings). A sample of this thread showing function j fell between
a switch into j and the next switch; a few hundred samples pin py-spy's zero to well under
a millisecond (``omnitrace.profile.chrometrace.calibrate``).

The switches also get py-spy's rounds written (it writes one only when some thread's stack
changed) and catch its late stamps: a sample stamped after the clock had moved on is not
used to place stacks inside spans (``chrometrace.consistent_rounds``).

Cost: each switch is a wake-up that takes the GIL (a hand-off a busy thread of the process
pays for) and a context switch, in every sampled process, idle or not: about half of what
`--flame` added to the served processes' CPU at 50 switches/s (``benchmarks/
flame_results.md``). So the holds follow py-spy's rate: uniform in [0.5, 1.5] sampling
periods, one switch per sample on average, never shorter than 10-30 ms (the holds of
before at every rate), so a fast sampler does not make the clock wake more. The price:
fewer rounds written (py-spy's waits are exponential: a wait holds a switch less often
when the holds are longer), a coarser offset and fewer late stamps caught. Holds of 1-3
periods (mean 2) coarsened these too much (``benchmarks/RESULTS.md``).
"""
from __future__ import annotations

import array
import os
import random
import threading
import time
import types
from typing import Any, Callable, Iterator

THREAD = "omnitrace-flame-clock"
PREFIX = "omnitrace_flame_clock_"
K = 32  # functions in the cycle
HOLD_PERIODS = (0.5, 1.5)  # random holds, in py-spy's sampling periods: mean one period
MIN_HOLD_S = (0.01, 0.03)  # the floor: at 50 samples/s and above, the holds of before


def _body(flips: Any, hold_s: float) -> None:
    flips.append(time.perf_counter_ns())  # read first thing in the frame py-spy will see
    time.sleep(hold_s)


def _named(i: int) -> Callable[[Any, float], None]:
    name = f"{PREFIX}{i:02d}"
    code = _body.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):  # 3.11+: py-spy shows the qualified name
        code = code.replace(co_qualname=name)
    return types.FunctionType(code, globals(), name)


FUNCS = [_named(i) for i in range(K)]


FLUSH_S = 1.3  # switches reach the file this often: a process ending by os._exit (a forked child) loses less


def hold_range(rate: float) -> tuple[float, float]:
    """(shortest, longest) hold in seconds at py-spy's ``rate`` samples/s."""
    period = 1.0 / rate
    return max(HOLD_PERIODS[0] * period, MIN_HOLD_S[0]), max(HOLD_PERIODS[1] * period, MIN_HOLD_S[1])


def holds(rate: float, rnd: random.Random) -> Iterator[float]:
    """The clock's schedule: each switch's hold, uniform in :func:`hold_range` (random: no
    period for py-spy's sampling to alias with)."""
    lo, hi = hold_range(rate)
    span, draw = hi - lo, rnd.random
    while True:
        yield lo + span * draw()


def _rate_from_env() -> int:
    from omnitrace.profile.config import DEFAULT_RATE, ENV_FLAME, FlameConfig
    try:
        return FlameConfig.from_json(os.environ[ENV_FLAME]).rate
    except (KeyError, ValueError):
        return DEFAULT_RATE


class Clock(threading.Thread):
    """``flips[k]``: when function ``k % K`` began (perf_counter_ns). With ``path``, the
    switches are appended there (raw little-endian int64) as they accumulate and by
    :meth:`flush` at exit. ``rate``: py-spy's samples/s (default: the run's, from the
    environment); ``seed``: a fixed schedule (tests)."""

    def __init__(self, path: str | None = None, rate: float | None = None, seed: int | None = None) -> None:
        super().__init__(name=THREAD, daemon=True)
        self.flips = array.array("q")
        self.stop = threading.Event()
        self.path = path
        self.rate = rate or _rate_from_env()
        self.seed = seed
        self._written = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        # between switches the thread sleeps: each switch is one wake-up and a few bytecodes
        schedule = holds(self.rate, random.Random(self.seed))
        lo, hi = hold_range(self.rate)
        every = max(1, round(FLUSH_S * 2 / (lo + hi)))
        flips, stopped, k = self.flips, self.stop.is_set, 0
        while not stopped():
            FUNCS[k % K](flips, next(schedule))
            k += 1
            if self.path is not None and k % every == 0:
                self.flush()

    def flush(self) -> None:
        if self.path is None:
            return
        with self._lock:
            n = len(self.flips)
            if n > self._written:
                try:
                    with open(self.path, "ab") as f:
                        f.write(self.flips[self._written:n].tobytes())
                    self._written = n
                except OSError:
                    pass
