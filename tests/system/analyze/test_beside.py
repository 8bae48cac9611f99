"""analyze/beside.py: work in a forked child, its result (or its error) back here, and
the work done here when the child dies without one."""
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
