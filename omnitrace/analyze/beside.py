"""Run part of the report beside the rest: a forked child computes it on the second core
while this process computes the rest (the report phase is CPU-bound Python, one GIL).

The child sees the parent's memory as it was at the fork (copy-on-write: an hour's run is
GBs that are never copied or pickled); only its result comes back, pickled through a
pipe. A result made of parts (``fn`` returns an iterator) comes back a part at a time as
the child makes them, and the child lets go of each once sent: a thread here keeps them as
their pickled bytes until ``result()`` (an hour's report rows held as objects in both
processes at once were ~1 GB more at the peak). Where fork is not available or the child
fails (killed, out of memory), the work is done here instead, at ``result()``: slower,
never a different answer.
"""
from __future__ import annotations

import collections
import multiprocessing as mp
import pickle
import threading
from typing import Any, Callable, Generic, TypeVar

from omnitrace.childproc import fork_available

T = TypeVar("T")
# below this much work a fork (page tables of a large process, a pickled result) costs
# more than it saves; callers compare their own measure of work against it
MIN_WORK = 2000
_PART, _END, _ERROR = range(3)


def _child(conn: Any, fn: Callable[..., Any], args: tuple, parts: bool,
           release: Callable[[], None] | None) -> None:
    try:
        if release is not None:
            release()
        if parts:
            for part in fn(*args):
                conn.send_bytes(pickle.dumps((_PART, part), pickle.HIGHEST_PROTOCOL))
                del part  # sent: the child keeps none of it
            out: tuple = (_END, None)
        else:
            out = (_END, fn(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, raised there
        out = (_ERROR, exc)
    try:
        conn.send_bytes(pickle.dumps(out, pickle.HIGHEST_PROTOCOL))
    finally:
        conn.close()


class Beside(Generic[T]):
    """``fn(*args)``, computed in a forked child from the moment this is made. ``parts``:
    ``fn`` returns an iterator, and ``result()`` is the list of its items. ``release``:
    called first in the child only, to let go of what ``fn`` does not read there (pages
    shared with this process are freed for good only once both let go of them)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, parts: bool = False,
                 release: Callable[[], None] | None = None) -> None:
        self._fn, self._args, self._parts = fn, args, parts
        self._proc = self._conn = self._reader = None
        self._got: collections.deque[bytes] = collections.deque()
        if not fork_available():
            return
        try:
            ctx = mp.get_context("fork")
            self._conn, child_end = ctx.Pipe(duplex=False)
            self._proc = ctx.Process(target=_child, args=(child_end, fn, args, parts, release), daemon=True,
                                     name="omnitrace-report-beside")
            self._proc.start()
            child_end.close()
        except OSError:  # no fork (process limit, memory): done here at result()
            self._proc = self._conn = None
            return
        self._reader = threading.Thread(target=self._receive, name="omnitrace-report-beside-reader",
                                        daemon=True)
        self._reader.start()

    def _receive(self) -> None:
        """The child's messages as they come (the pipe never fills while it works)."""
        try:
            while True:
                self._got.append(self._conn.recv_bytes())
        except (EOFError, OSError):  # the child is done (or died)
            pass

    def result(self) -> T:
        """The child's result (its exception, raised here); computed here if it failed."""
        if self._proc is not None:
            self._reader.join()
            self._conn.close()
            self._proc.join()
            got, parts = self._got, []
            while got:
                kind, value = pickle.loads(got.popleft())
                if kind == _ERROR:
                    raise value
                if kind == _END:
                    return parts if self._parts else value
                parts.append(value)
        # no fork, or the child died without its whole result
        return list(self._fn(*self._args)) if self._parts else self._fn(*self._args)
