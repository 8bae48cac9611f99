"""`omnitrace compare`: per-category deltas with hierarchical bootstrap CIs."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.otlp_fixture import US, line, three_stage_request, write_run


def _run(path: str, extra_put_us: float, n: int = 12) -> str:
    lines = []
    for i in range(n):
        spans = three_stage_request(f"r{i}", off=i * 2000)
        # stretch stage 0's put and everything after it by extra_put_us (+ a little per-request noise)
        shift = int((extra_put_us + (i % 3)) * US)
        put_end = None
        for s in spans:
            a = {x["key"]: x["value"] for x in s["attributes"]}
            if s["name"] == "omni.chunk.put" and a.get("omni.stage.id", {}).get("intValue") == "0" \
                    and a.get("omni.chunk.index", {}).get("intValue") == "0":
                put_end = int(s["endTimeUnixNano"])
        for s in spans:
            for k in ("startTimeUnixNano", "endTimeUnixNano"):
                if int(s[k]) >= put_end:
                    s[k] = str(int(s[k]) + shift)
            for e in s.get("events", []):
                if int(e["timeUnixNano"]) >= put_end:
                    e["timeUnixNano"] = str(int(e["timeUnixNano"]) + shift)
        lines.append(line(spans))
    return write_run(path, lines)


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
