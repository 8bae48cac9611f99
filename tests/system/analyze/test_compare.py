"""`omnitrace compare`: per-category deltas with hierarchical bootstrap CIs."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import load_run
from omnitrace.analyze.compare import TTFP, compare, ttfp_rows
from omnitrace.cli.loadtest import verdicts
from omnitrace.conventions import Ev
from omnitrace.render.compare_html import write_compare_html
from tests.support.event_fixture import (TALKER, TALKER_RECV, THINKER, THINKER_SEND, chunk_events,
                                         three_stage_events, write_event_run)


def _run(path: str, extra_put_us: float, n: int = 12, bench: dict | None = None) -> str:
    """n worked-example requests, recorded as a run records them; each one's thinker put of
    chunk 0, and everything after it, ``extra_put_us`` (+ a little per-request noise) later."""
    return write_event_run(path, _script(extra_put_us, n), bench)


def _script(extra_put_us: float, n: int) -> list[tuple]:
    script = []
    for i in range(n):
        events = three_stage_events(f"r{i}", off=i * 2000)
        put_end = next(e[7] for e in events if e[1] == Ev.PUT_END and e[2] == f"r{i}" and e[3] == 0 and e[4] == 0)
        shift = extra_put_us + (i % 3)
        script += [e[:7] + (e[7] + shift,) if e[7] >= put_end else e for e in events]
    return sorted(script, key=lambda e: e[7])


def test_compare_finds_the_moved_category(tmp_path):
    a = _run(str(tmp_path / "a"), 0)
    b = _run(str(tmp_path / "b"), 50)
    r = subprocess.run([sys.executable, "-m", "omnitrace", "compare", a, b, "--json", "--bootstrap", "300"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {(x["stage"], x["category"]): x for x in json.loads(r.stdout)["rows"]}
    put = rows[("0:thinker", "put")]
    assert abs(put["delta_ms"] - 0.050) < 1e-6 and put["significant"] and put["ci_low_ms"] > 0.04
    assert rows[("all", "ttfp")]["significant"]
    assert not rows[("1:talker", "compute")]["significant"]
    r = subprocess.run([sys.executable, "-m", "omnitrace", "compare", a, str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a run directory" in r.stderr and "Traceback" not in r.stderr


def _component_run(path: str, snapshot_us: float, n: int = 20) -> str:
    """A run with no API requests (the adapter pair under a harness): chunk events only.
    Each chunk: snapshot [0, s], FIFO [s, s+20], process [+20, +25], put [+25, +35], poll
    lag [+35, +40], get [+40, +45], wait for the schedule [+45, +50]."""
    script: list = []
    for i in range(n):
        o = i * 1000.0
        s = o + snapshot_us + (i % 4)
        chunk_events(script, f"h{i}", THINKER, THINKER_SEND, TALKER_RECV, TALKER, 0, 1, 0, (o, s), s + 20,
                     (s + 20, s + 25), (s + 25, s + 35), (s + 40, s + 45), s + 50)
    return write_event_run(path, script)


def test_component_level_runs_report_and_compare(tmp_path):
    a = _component_run(str(tmp_path / "a"), 10)
    b = _component_run(str(tmp_path / "b"), 50)
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", a], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "component-level run" in r.stdout and "Snapshot cost per chunk" in r.stdout
    r = subprocess.run([sys.executable, "-m", "omnitrace", "compare", a, b, "--json", "--bootstrap", "300"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["rows"] == [] and any("without API requests" in w for w in res["warnings"])
    comp = {(x["group"], x["metric"]): x for x in res["components"]}
    snap = comp[("stage 0", "snapshot us")]
    assert abs(snap["delta"] - 40.0) < 1e-6 and snap["significant"] and snap["ci_low"] > 30
    assert not comp[("0->1", "put us")]["significant"]
    text = subprocess.run([sys.executable, "-m", "omnitrace", "compare", a, b, "--bootstrap", "100"],
                          capture_output=True, text=True, timeout=60).stdout
    assert "Components (mean per chunk)" in text and "snapshot us" in text


def test_compare_warns_when_bench_settings_differ(tmp_path):
    def bench(conc: int, out_len: int) -> dict:
        return {"args": {"concurrency": [str(conc)], "num_prompts": 12, "input_len": 100,
                         "output_len": out_len}, "requests": [{"id": f"r{i}", "warmup": False}
                                                              for i in range(12)]}
    script = sorted((e for i in range(12) for e in three_stage_events(f"r{i}", off=i * 2000)), key=lambda e: e[7])
    a = write_event_run(str(tmp_path / "a"), script, bench=bench(8, 100))
    b = write_event_run(str(tmp_path / "b"), script, bench=bench(32, 100))
    r = subprocess.run([sys.executable, "-m", "omnitrace", "compare", a, b, "--bootstrap", "100"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "warning: bench setting 'concurrency' differs: A [\"8\"] vs B [\"32\"]" in r.stdout
    assert "output_len" not in r.stdout  # the same on both sides: no word


@pytest.mark.unit
def test_report_reads_a_run_given_twice_once(tmp_path):
    """`report A A`, A through a symlink, and a copy of A (the same run id): each run once,
    with a warning; not every count doubled."""
    a = write_event_run(str(tmp_path / "a"), script := _script(0, 12))
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


@pytest.mark.unit
def test_compare_marks_deltas_against_a_same_damaged_or_failed_run(tmp_path):
    a = _run(str(tmp_path / "a"), 0, bench=_bench(12))
    b = _run(str(tmp_path / "b"), 50, bench=_bench(12))
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
    dead = _run(str(tmp_path / "dead"), 0, bench=_bench(12, 'HTTP 500: {"message": "stage 0 (thinker) died"}'))
    res = compare([a], [dead], n_boot=200)
    assert any("every measured request failed (12)" in w for w in res["unfit"]), res["warnings"]
    assert not any("without API requests" in w for w in res["warnings"])
    html = tmp_path / "c.html"
    write_compare_html(res, str(html))
    assert "not fit to compare" in html.read_text() and "every measured request failed" in html.read_text()


@pytest.mark.unit
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
