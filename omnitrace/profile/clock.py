"""The clock thread every process of a `--flame` run runs while py-spy samples it.

py-spy stamps its samples in microseconds since its own start, an instant nothing else can
read. This thread cycles through ``K`` functions with distinct names, holding each for a
random 10-30 ms, and notes when each one began on ``perf_counter_ns`` (CLOCK_
MONOTONIC, the clock of omnitrace's event rings). A sample of this thread showing function
j fell between a switch into j and the next switch; a few hundred samples pin py-spy's
zero to well under a millisecond (``omnitrace.profile.chrometrace.calibrate``).

The short holds also catch py-spy's late stamps: a sample stamped after the clock had
moved on is not used to place stacks inside spans (``chrometrace.consistent_rounds``).
Cost: one wake-up every ~20 ms, a GIL hand-off each that a busy thread of the process pays
for (what it adds to a process: ``benchmarks/RESULTS.md``). The holds stay short although a
25 Hz sampler sees only every other switch: py-spy writes a sampling round only when some
thread's stack changed, and these switches are what gets most rounds written. Holds of 1-3
sampling periods were tried; fewer rounds were written and calibration was coarser.
"""
from __future__ import annotations

import array
import random
import threading
import time
import types
from typing import Any, Callable

THREAD = "omnitrace-flame-clock"
PREFIX = "omnitrace_flame_clock_"
K = 32  # functions in the cycle
HOLD_S = (0.01, 0.03)  # random holds: no period to alias with py-spy's sampling


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


FLUSH_EVERY = 64  # switches (~1.3 s): a process that ends by os._exit (a forked child) loses less


class Clock(threading.Thread):
    """``flips[k]``: when function ``k % K`` began (perf_counter_ns). With ``path``, the
    switches are appended there (raw little-endian int64) as they accumulate and by
    :meth:`flush` at exit."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__(name=THREAD, daemon=True)
        self.flips = array.array("q")
        self.stop = threading.Event()
        self.path = path
        self._written = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        rnd = random.Random()
        k = 0
        while not self.stop.is_set():
            FUNCS[k % K](self.flips, rnd.uniform(*HOLD_S))
            k += 1
            if self.path is not None and k % FLUSH_EVERY == 0:
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
