"""omnitrace/threads.py: a producer run ahead on a thread, calls handed on in order."""
import threading

import pytest

from omnitrace import threads


def test_read_ahead_gives_every_item_in_order_made_on_another_thread():
    made_on = set()

    def items():
        for i in range(50):
            made_on.add(threading.get_ident())
            yield i

    assert list(threads.read_ahead(items(), depth=3)) == list(range(50))
    assert made_on and threading.get_ident() not in made_on


def test_read_ahead_makes_at_most_depth_ahead():
    made = []

    def items():
        for i in range(10):
            made.append(i)
            yield i

    it = threads.read_ahead(items(), depth=2)
    assert next(it) == 0
    threading.Event().wait(0.3)  # time for the producer to run as far ahead as it may
    # 0 taken, 1 and 2 waiting in the queue, 3 made and waiting to be put
    assert len(made) <= 4
    it.close()


def test_an_error_making_an_item_is_raised_to_the_reader_after_the_items_before():
    def items():
        yield 1
        raise ValueError("corrupt")

    got = []
    with pytest.raises(ValueError, match="corrupt"):
        for x in threads.read_ahead(items()):
            got.append(x)
    assert got == [1]


def test_leaving_early_stops_the_thread_and_closes_the_items():
    closed = threading.Event()

    def items():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = threading.active_count()
    for x in threads.read_ahead(items(), name="omnitrace-test-ahead"):
        if x == 5:
            break
    assert closed.wait(5)
    assert threading.active_count() == before
    assert not [t for t in threading.enumerate() if t.name == "omnitrace-test-ahead"]


def test_in_order_beside_calls_in_order_on_one_other_thread():
    calls, idents = [], set()

    def fn(i):
        calls.append(i)
        idents.add(threading.get_ident())

    with threads.in_order_beside(fn, depth=2) as submit:
        for i in range(100):
            submit(i)
    assert calls == list(range(100))
    assert len(idents) == 1 and threading.get_ident() not in idents


def test_in_order_beside_raises_the_first_error_on_leaving_and_calls_nothing_after_it():
    calls = []

    def fn(i):
        if i == 3:
            raise KeyError(i)
        calls.append(i)

    with pytest.raises(KeyError):
        with threads.in_order_beside(fn) as submit:
            for i in range(10):
                submit(i)
    assert calls == [0, 1, 2]
