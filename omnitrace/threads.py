"""Generic concurrency for the readers of a run: a producer run ahead on a thread, and calls
handed to one worker thread in order. Domain modules (the loader, the event-log reader) say
what runs beside what; how is here (as OpenTelemetry's SDK keeps its batch processor's
threading out of the exporters)."""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterator


def read_ahead(items: Iterator[Any], depth: int = 1, name: str = "omnitrace-read-ahead") -> Iterator[Any]:
    """``items``, up to ``depth`` of them made ahead by a thread while the caller works on
    the one before (the work beside must release the GIL to gain: numpy, zstd). Leaving
    early stops the thread and closes ``items``; an error making one is raised here."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: tuple) -> bool:
        while not stop.is_set():  # the reader may have left (an error): never block on it
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for x in items:
                if not offer((True, x)):
                    return
            offer((False, None))
        except BaseException as exc:  # handed to the reader, raised there
            offer((False, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:  # a generator's files close on this thread, now
                close()

    t = threading.Thread(target=produce, name=name, daemon=True)
    t.start()
    try:
        while True:
            more, x = q.get()
            if not more:
                if x is not None:
                    raise x
                return
            yield x
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def in_order_beside(fn: Callable[..., None], depth: int = 4,
                    name: str = "omnitrace-in-order") -> Iterator[Callable[..., None]]:
    """``submit(*args)`` calls ``fn(*args)`` on one thread, in the order submitted, while
    the caller goes on (at most ``depth`` calls waiting). Leaving waits for the
    calls; the first error of one is raised then."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    errors: list[BaseException] = []

    def work() -> None:
        while (item := q.get()) is not None:
            if not errors:  # after an error the rest is only drained
                try:
                    fn(*item)
                except BaseException as exc:  # handed to the caller, raised there
                    errors.append(exc)

    t = threading.Thread(target=work, name=name, daemon=True)
    t.start()
    try:
        yield lambda *args: q.put(args)
    finally:
        q.put(None)
        t.join()
    if errors:
        raise errors[0]
