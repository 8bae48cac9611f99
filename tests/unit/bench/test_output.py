"""The bench's results file (omnitrace.bench.output) is created, never replacing one already
there. What a user meets (issue 25, items 3 and 1): tests/system/bench/test_bench_output.py."""
from __future__ import annotations


import pytest

from omnitrace.bench.output import _create
def test_create_never_replaces(tmp_path):
    dest, tmp = tmp_path / "bench.json", tmp_path / "t"
    dest.write_text("theirs")
    tmp.write_text("ours")
    with pytest.raises(FileExistsError):
        _create(str(dest), str(tmp))
    assert dest.read_text() == "theirs"
