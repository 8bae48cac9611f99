"""The clock thread every process of a `--flame` run runs while py-spy samples it.

py-spy stamps its samples in microseconds since its own start, an instant nothing else can
read. This thread cycles through ``K`` functions with distinct names, holding each for a
random time, and notes when each one began on ``perf_counter_ns`` (CLOCK_MONOTONIC, the
clock of omnitrace's event rings). A sample of this thread showing function j fell between
a switch into j and the next switch; a few hundred samples pin py-spy's zero to well under
a millisecond (``omnitrace.profile.chrometrace.calibrate``).

py-spy's stamps and these switches are on the same clock (its ``Instant`` is
CLOCK_MONOTONIC), so the zero is one constant per py-spy: it needs fast switches only for a
while after that py-spy starts. So the clock runs in two paces:

* a **burst** of ``BURST_S`` when the profile runner asks for one (one datagram on the
  clock's socket, sent as each py-spy, the first or a rotated one, begins to sample):
  holds of 0.25-0.75 sampling periods, never shorter than 10-30 ms (at 25 samples/s and
  above, the holds that calibrated to ~0.3 ms before); this is what pins the zero;
* **steady** otherwise: holds of 0.5-1.5 s. The switches still catch a py-spy that fell
  behind for longer (``finalize.unsampled``) and some late stamps
  (``chrometrace.consistent_rounds``), and the process's rounds are those in which some
  thread's stack changed.

Why: each switch is a wake-up that takes the GIL (a hand-off a busy thread of the process
pays for) and a context switch, in every sampled process, idle or not: ~30 us each, and at
one switch per sample (25/s) about half of what `--flame` added to the served processes'
CPU (``benchmarks/flame_results.md``). With a 5-s burst per 60-s py-spy the clock switches
~5 times a second instead of 25. (A 3-s burst coarsened the offset to ~0.7 ms; its width
goes as the burst's holds over its samples.)
"""
from __future__ import annotations

import array
import os
import random
import select
import socket
import threading
import time
import types
from typing import Any, Callable

THREAD = "omnitrace-flame-clock"
PREFIX = "omnitrace_flame_clock_"
K = 32  # functions in the cycle
BURST_S = 5.0  # fast switches this long after each request (each py-spy's start)
BURST_PERIODS = (0.25, 0.75)  # a burst's holds, in py-spy's sampling periods
MIN_HOLD_S = (0.01, 0.03)  # a burst's floor: a fast sampler does not make the clock wake more
STEADY_S = (0.5, 1.5)  # the holds between bursts: about one switch a second
FLUSH_S = 1.3  # switches reach the file this often: a process ending by os._exit (a forked child) loses less


def _body(flips: Any, hold_ms: float, wait: Callable[[float], list]) -> list:
    flips.append(time.perf_counter_ns())  # read first thing in the frame py-spy will see
    return wait(hold_ms)  # a C call (poll): this frame stays the stack's leaf


def _named(i: int) -> Callable[[Any, float, Callable[[float], list]], list]:
    name = f"{PREFIX}{i:02d}"
    code = _body.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):  # 3.11+: py-spy shows the qualified name
        code = code.replace(co_qualname=name)
    return types.FunctionType(code, globals(), name)


FUNCS = [_named(i) for i in range(K)]


def hold_range(rate: float, burst: bool) -> tuple[float, float]:
    """(shortest, longest) hold in seconds, in a burst or steady, at py-spy's ``rate``
    samples/s. Each hold is uniform in it (random: no period for py-spy's sampling to alias
    with)."""
    if not burst:
        return STEADY_S
    period = 1.0 / rate
    return max(BURST_PERIODS[0] * period, MIN_HOLD_S[0]), max(BURST_PERIODS[1] * period, MIN_HOLD_S[1])


def address(runner_socket: str, pid: int) -> str:
    """The abstract socket on which process ``pid``'s clock takes burst requests, from the
    runner's socket name (``OMNITRACE_FLAME_SOCKET``)."""
    return f"\0{runner_socket}-clock-{pid}"


def ask_burst(addr: str) -> bool:
    """Ask the clock at ``addr`` for a burst (the profile runner, as a py-spy begins)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"b", addr)
        return True
    except OSError:
        return False  # the process is gone, or its clock never started


def _rate_from_env() -> int:
    from omnitrace.profile.config import DEFAULT_RATE, ENV_FLAME, FlameConfig
    try:
        return FlameConfig.from_json(os.environ[ENV_FLAME]).rate
    except (KeyError, ValueError):
        return DEFAULT_RATE


class Clock(threading.Thread):
    """``flips[k]``: when function ``k % K`` began (perf_counter_ns). With ``path``, the
    switches are appended there (raw little-endian int64) as they accumulate and by
    :meth:`flush` at exit. ``addr``: the socket it takes burst requests on (:func:`address`;
    without one it stays steady); ``rate``: py-spy's samples/s (default: the run's, from the
    environment); ``seed``: a fixed schedule (tests)."""

    def __init__(self, path: str | None = None, rate: float | None = None, seed: int | None = None,
                 addr: str | None = None) -> None:
        super().__init__(name=THREAD, daemon=True)
        self.flips = array.array("q")
        self.bursts = array.array("q")  # when each burst request arrived (perf_counter_ns)
        self.stop = threading.Event()
        self.path = path
        self.rate = rate or _rate_from_env()
        self.seed = seed
        self._written = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if addr is not None:
            try:
                self._sock.bind(addr)  # bound before the process announces itself: no request is lost
            except OSError:
                pass  # (the name taken): steady only, calibrated from its slower switches

    def run(self) -> None:
        # between switches the thread waits in poll(): each switch is one wake-up and a few
        # bytecodes; a burst request ends the wait at once
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        draw = random.Random(self.seed).random
        steady, burst = hold_range(self.rate, False), hold_range(self.rate, True)
        flips, stopped, now, k = self.flips, self.stop.is_set, time.perf_counter_ns, 0
        until = flushed = 0
        while not stopped():
            lo, hi = burst if now() < until else steady
            if FUNCS[k % K](flips, (lo + (hi - lo) * draw()) * 1e3, poller.poll):
                self._take_requests()
                until = now() + int(BURST_S * 1e9)
            k += 1
            if self.path is not None and now() - flushed >= FLUSH_S * 1e9:
                self.flush()
                flushed = now()

    def _take_requests(self) -> None:
        try:
            while self._sock.recv(16, socket.MSG_DONTWAIT):
                self.bursts.append(time.perf_counter_ns())
        except OSError:
            pass  # none left

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
