"""The golden report: `omnitrace report --json` on the reference inputs
(tests/support/golden_inputs.py) is byte-identical to the stored file, so a change beneath
the report (the loader, the walk, the tables) that moves any figure, warning or order
fails here. Nothing in it is left out: the report holds no wall-clock measurement of
itself; ``omnitrace_version`` is the package's (a version bump rewrites the files:
``python -m tests.support.golden_inputs``)."""
from __future__ import annotations

import os

import pytest

from tests.support import golden_inputs as gi

def _stored(name: str) -> bytes:
    with open(os.path.join(gi.REPORTS, f"{name}.json"), "rb") as f:
        return f.read()


@pytest.mark.parametrize("name", gi.STORED)
def test_the_report_of_a_stored_run_is_the_golden_file(name):
    assert gi.report_json(gi.RUNS, name) == _stored(name)


def test_the_report_of_the_synthetic_run_is_the_golden_file(synthetic_run):
    parent, name = os.path.split(synthetic_run)
    assert gi.report_json(parent, name) == _stored("synthetic")


def test_the_golden_files_hold_what_they_guard():
    """Each input exercises what it is there for (a golden file of an empty report would
    guard nothing)."""
    import orjson
    worked, hol, syn = (orjson.loads(_stored(n)) for n in ("worked", "hol", "synthetic"))
    assert worked["window"]["measured"] == worked["window"]["attributed"] == 5
    assert {(h["victim"], h["culprit"]) for h in hol["head_of_line"]} == {("v", "x"), ("v", "y")}
    assert syn["window"]["attributed"] == 292 and syn["failures"]["failed"] == 1
    assert syn["head_of_line_pairs"] > 100
    assert any(s[4] == "overlap" for r in syn["requests"] for s in r["segments"])
