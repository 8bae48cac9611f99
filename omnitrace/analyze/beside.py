"""Run part of the report beside the rest: a forked child computes it on the second core
while this process computes the rest (the report phase is CPU-bound Python, one GIL).

The child sees the parent's memory as it was at the fork (copy-on-write: an hour's run is
GBs that are never copied or pickled); only its result comes back, pickled through a
pipe. Where fork is not available or the child fails (killed, out of memory), the work
is done here instead, at the first ``result()``: slower, never a different answer.
"""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Generic, TypeVar

from omnitrace.childproc import fork_available

T = TypeVar("T")
# below this much work a fork (page tables of a large process, a pickled result) costs
# more than it saves; callers compare their own measure of work against it
MIN_WORK = 2000


def _child(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    try:
        out = (True, fn(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, raised there
        out = (False, exc)
    try:
        conn.send(out)
    finally:
        conn.close()


class Beside(Generic[T]):
    """``fn(*args)``, computed in a forked child from the moment this is made."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._proc = self._conn = None
        if not fork_available():
            return
        try:
            ctx = mp.get_context("fork")
            self._conn, child_end = ctx.Pipe(duplex=False)
            self._proc = ctx.Process(target=_child, args=(child_end, fn, args), daemon=True,
                                     name="omnitrace-report-beside")
            self._proc.start()
            child_end.close()
        except OSError:  # no fork (process limit, memory): done here at result()
            self._proc = self._conn = None

    def result(self) -> T:
        """The child's result (its exception, raised here); computed here if it failed."""
        if self._proc is not None:
            try:
                ok, value = self._conn.recv()
            except (EOFError, OSError):  # the child died without a result
                ok, value = None, None
            finally:
                self._conn.close()
                self._proc.join()
            if ok is True:
                return value
            if ok is False:
                raise value
        return self._fn(*self._args)

