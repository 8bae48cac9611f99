"""`omnitrace compare`: per-category deltas with hierarchical bootstrap CIs."""
from __future__ import annotations

import json
import subprocess
import sys

from omnitrace.conventions import Ev
from tests.support.event_fixture import three_stage_events, write_event_run
from tests.support.otlp_fixture import line, three_stage_request, write_run


def _run(path: str, extra_put_us: float, n: int = 12) -> str:
    """n worked-example requests, recorded as a run records them; each one's thinker put of
    chunk 0, and everything after it, ``extra_put_us`` (+ a little per-request noise) later."""
    script = []
    for i in range(n):
        events = three_stage_events(f"r{i}", off=i * 2000)
        put_end = next(e[7] for e in events if e[1] == Ev.PUT_END and e[2] == f"r{i}" and e[3] == 0 and e[4] == 0)
        shift = extra_put_us + (i % 3)
        script += [e[:7] + (e[7] + shift,) if e[7] >= put_end else e for e in events]
    return write_event_run(path, sorted(script, key=lambda e: e[7]))


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
    """A run with no API requests (the adapter pair under a harness): chunk spans only."""
    from tests.support.otlp_fixture import chunk_spans
    lines = []
    for i in range(n):
        o = i * 1000.0
        s = snapshot_us + (i % 4)
        lines.append(line(chunk_spans(f"h{i}", 0, 1, 0, (o, o + s), (o + s, o + s + 20),
                                      (o + s + 20, o + s + 25), (o + s + 25, o + s + 35),
                                      (o + s + 35, o + s + 40), (o + s + 40, o + s + 45),
                                      (o + s + 45, o + s + 50))))
    return write_run(path, lines)


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
    a = write_run(str(tmp_path / "a"), [line(three_stage_request(f"r{i}", off=i * 2000)) for i in range(12)],
                  bench=bench(8, 100))
    b = write_run(str(tmp_path / "b"), [line(three_stage_request(f"r{i}", off=i * 2000)) for i in range(12)],
                  bench=bench(32, 100))
    r = subprocess.run([sys.executable, "-m", "omnitrace", "compare", a, b, "--bootstrap", "100"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "warning: bench setting 'concurrency' differs: A [\"8\"] vs B [\"32\"]" in r.stdout
    assert "output_len" not in r.stdout  # the same on both sides: no word
