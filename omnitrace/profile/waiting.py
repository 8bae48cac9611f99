"""Which sampled stacks are a thread waiting, not working.

The rule: a stack is *waiting* when its innermost Python frame is one of the blocking
calls below: a lock or condition wait, a selector's select, a blocking pipe read, an
executor worker parked on its queue. py-spy samples every thread with ``--idle`` (its
chrometrace output needs every thread in every round, ``runner.py``) and marks none of
them idle, so the per-process flame graphs would be mostly parked threads (~75% of the
thread time of a stage process under load). A blocking call made in C (``time.sleep``,
``SimpleQueue.get``) leaves its Python caller as the innermost frame; where that caller
does nothing else (``_worker`` of ``concurrent.futures``) it is listed, otherwise the
stack counts as working. Labels are ``name (file)`` as :meth:`Store.frame_label` makes.
"""
from __future__ import annotations

WAITING_FRAMES = frozenset({
    "Condition.wait (threading.py)", "Event.wait (threading.py)", "Thread.join (threading.py)",
    "Thread._wait_for_tstate_lock (threading.py)", "Semaphore.acquire (threading.py)",
    "Barrier.wait (threading.py)",
    "Queue.get (queue.py)",
    "Connection._recv (connection.py)", "wait (connection.py)",
    "_worker (thread.py)",  # concurrent.futures: parked on its work queue (a C get)
    "Poller.poll (poll.py)",  # pyzmq
})
WAITING_SUFFIXES = (".select (selectors.py)",)  # Epoll/Poll/Select/KqueueSelector.select


def is_waiting(leaf: str) -> bool:
    """Whether a stack whose innermost frame is labelled ``leaf`` is a thread waiting."""
    return leaf in WAITING_FRAMES or leaf.endswith(WAITING_SUFFIXES)


def split(stacks: dict[tuple[str, ...], float]) -> tuple[dict, dict]:
    """Collapsed stacks -> (working, waiting)."""
    work: dict = {}
    wait: dict = {}
    for stack, sec in stacks.items():
        (wait if stack and is_waiting(stack[-1]) else work)[stack] = sec
    return work, wait
