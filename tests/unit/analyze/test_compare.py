"""`omnitrace compare` and the report in process: a run given twice is read once, deltas
against a same, damaged or failed run are marked, and the A/B verdicts' intervals stay
above -100%. As a command: tests/system/analyze/test_compare.py."""
from __future__ import annotations

import glob
import os
import shutil

import numpy as np

from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import load_run
from omnitrace.analyze.compare import TTFP, compare, ttfp_rows
from omnitrace.cli.loadtest import verdicts
from omnitrace.render.compare_html import write_compare_html
from tests.support.compare_runs import put_delayed_run, put_delayed_script
from tests.support.event_fixture import write_event_run


def test_report_reads_a_run_given_twice_once(tmp_path):
    """`report A A`, A through a symlink, and a copy of A (the same run id): each run once,
    with a warning; not every count doubled."""
    a = write_event_run(str(tmp_path / "a"), script := put_delayed_script(0, 12))
    os.symlink(a, tmp_path / "link")
    shutil.copytree(a, tmp_path / "copy")
    run = load_run([a, str(tmp_path / "link"), a + "/", str(tmp_path / "copy")])
    assert run.events == len(script)
    rep = build_report(run, waterfalls=0)
    assert rep["window"]["attributed"] == 12 and len(rep["runs"]) == 1
    assert sum("same run as" in w and "read once" in w for w in rep["warnings"]) == 3, rep["warnings"]


def _bench(n: int, error: str | None = None) -> dict:
    return {"requests": [{"id": f"r{i}", "warmup": False, **({"error": error} if error else {})}
                         for i in range(n)]}


def test_compare_marks_deltas_against_a_same_damaged_or_failed_run(tmp_path):
    a = put_delayed_run(str(tmp_path / "a"), 0, bench=_bench(12))
    b = put_delayed_run(str(tmp_path / "b"), 50, bench=_bench(12))
    clean = compare([a], [b], n_boot=200)
    assert clean["unfit"] == [] and not any(r["doubtful"] for r in clean["rows"] + clean["components"])
    shutil.copytree(a, tmp_path / "a2")  # a copy of A is A
    same = compare([a], [str(tmp_path / "a2")], n_boot=200)
    assert len(same["unfit"]) == 1 and "are the same run" in same["unfit"][0]
    assert all(r["doubtful"] for r in same["rows"] + same["components"])
    torn = str(tmp_path / "torn")  # B's last event segment loses its last 100 bytes (a killed writer)
    shutil.copytree(b, torn)
    seg = sorted(glob.glob(os.path.join(torn, "events", "*")))[-1]
    os.truncate(seg, os.path.getsize(seg) - 100)
    res = compare([a], [torn], n_boot=200)
    assert any(torn in w and "torn event segment" in w for w in res["unfit"]), res["warnings"]
    assert all(r["doubtful"] for r in res["rows"] + res["components"])
    dead = put_delayed_run(str(tmp_path / "dead"), 0, bench=_bench(12, 'HTTP 500: {"message": "stage 0 (thinker) died"}'))
    res = compare([a], [dead], n_boot=200)
    assert any("every measured request failed (12)" in w for w in res["unfit"]), res["warnings"]
    assert not any("without API requests" in w for w in res["warnings"])
    html = tmp_path / "c.html"
    write_compare_html(res, str(html))
    assert "not fit to compare" in html.read_text() and "every measured request failed" in html.read_text()


def test_ab_verdicts_stay_above_minus_100_percent_and_hide_unprintable_means():
    """A skewed A (one request 500x the others) once gave [-280, ...]: the relative
    interval is the ratio's; a move between two means that both print 0.00 ms is counted,
    not shown as `-33% (0.00 -> 0.00 ms)`."""
    skewed, tiny = ("0:thinker", "snapshot"), ("all", "remainder")
    ra = [{TTFP: np.full(12, 10.0), skewed: np.array([0.01] * 11 + [5.0]), tiny: np.full(12, 0.003)}]
    rb = [{TTFP: np.full(12, 9.0), skewed: np.full(12, 0.001), tiny: np.full(12, 0.002)}]
    res = {"rows": ttfp_rows(ra, rb, np.random.default_rng(0), 400, 0.95), "unfit": []}
    snap = next(r for r in res["rows"] if r["category"] == "snapshot")
    assert snap["significant"] and snap["ci_low_ms"] / snap["a_ms"] < -1  # the old reading
    lines = verdicts(res)
    line = next(x for x in lines if x.startswith("0:thinker snapshot"))
    low = float(line.split("[")[1].split(",")[0])
    assert -100 <= low < 0, line
    assert not any("remainder" in x or "0.00 -> 0.00" in x for x in lines), lines
    assert lines[-1].startswith("(1 more moved"), lines
    assert all(x.endswith("!") for x in verdicts(res | {"unfit": ["same run"]})[:-1])
