"""`omnitrace compare`: per-category deltas with hierarchical bootstrap CIs, run as a command.
In process (a run given twice, unfit runs, the A/B verdicts): tests/unit/analyze/test_compare.py."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.compare_runs import put_delayed_run
from tests.support.event_fixture import (TALKER, TALKER_RECV, THINKER, THINKER_SEND, chunk_events,
                                         three_stage_events, write_event_run)


def test_compare_finds_the_moved_category(tmp_path):
    a = put_delayed_run(str(tmp_path / "a"), 0)
    b = put_delayed_run(str(tmp_path / "b"), 50)
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


def test_compare_warns_once_when_one_side_is_an_open_loop(tmp_path):
    """A closed loop (bench.json's request_rate null) against a Poisson one: the rate
    differs, once; the default gap shape is no second warning."""
    def bench(rate: float | None) -> dict:
        return {"args": {"concurrency": ["16"], "request_rate": rate, "burstiness": 1.0},
                "requests": [{"id": f"r{i}", "warmup": False} for i in range(12)]}
    script = sorted((e for i in range(12) for e in three_stage_events(f"r{i}", off=i * 2000)), key=lambda e: e[7])
    a = write_event_run(str(tmp_path / "a"), script, bench=bench(None))
    b = write_event_run(str(tmp_path / "b"), script, bench=bench(8.0))
    r = subprocess.run([sys.executable, "-m", "omnitrace", "compare", a, b, "--bootstrap", "100"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "warning: bench setting 'request_rate' differs: A null vs B 8.0" in r.stdout
    assert "burstiness" not in r.stdout
