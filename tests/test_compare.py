"""`omnitrace compare`: per-category deltas with hierarchical bootstrap CIs."""
from __future__ import annotations

import json
import subprocess
import sys

from otlp_fixture import US, line, three_stage_request, write_run


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
