"""analyze/beside.py: work in a forked child, its result (whole, or a part at a time) or its
error back here, and the work done here when the child dies without one."""
import os

import pytest

from omnitrace.analyze.beside import Beside


def _square_in_child(x: int, parent: int) -> tuple[int, bool]:
    return x * x, os.getpid() != parent


def _fails(_: int) -> None:
    raise ValueError("bad input in the child")


def _dies_in_child(parent: int) -> str:
    if os.getpid() != parent:
        os._exit(9)  # killed, out of memory: no result
    return "computed here"


def test_the_result_comes_from_a_child():
    assert Beside(_square_in_child, 7, os.getpid()).result() == (49, True)


def test_the_childs_error_is_raised_here():
    with pytest.raises(ValueError, match="bad input in the child"):
        Beside(_fails, 1).result()


def test_a_child_that_dies_without_a_result_is_replaced_by_the_work_done_here():
    assert Beside(_dies_in_child, os.getpid()).result() == "computed here"


def _parts_in_child(n: int, parent: int):
    for i in range(n):
        yield i, os.getpid() != parent


def _dies_after_a_part(parent: int):
    yield "first"
    if os.getpid() != parent:
        os._exit(9)
    yield "second"


def _fails_after_a_part(_: int):
    yield 1
    raise ValueError("bad part in the child")


def test_parts_come_back_in_order_from_the_child():
    assert Beside(_parts_in_child, 3, os.getpid(), parts=True).result() == [(0, True), (1, True), (2, True)]


def test_a_child_that_dies_between_parts_is_replaced_by_all_of_them_done_here():
    assert Beside(_dies_after_a_part, os.getpid(), parts=True).result() == ["first", "second"]


def test_an_error_after_some_parts_is_raised_here():
    with pytest.raises(ValueError, match="bad part in the child"):
        Beside(_fails_after_a_part, 1, parts=True).result()


def test_release_runs_in_the_child_only():
    seen = []
    assert Beside(_square_in_child, 3, os.getpid(), release=lambda: seen.append(1)).result() == (9, True)
    assert seen == []  # the child's list, not this one
