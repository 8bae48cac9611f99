"""benchmarks/runtime_costs.py runs (--quick) and shows what it measures: recursive snapshots
far slower than flat copies, the shm pool faster than a segment per chunk. The runtime's
building blocks in process: tests/unit/runtime/test_building_blocks.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.sources import ROOT


@pytest.mark.timeout(60)
def test_benchmark_script_runs(tmp_path):
    out = tmp_path / "costs.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "runtime_costs.py"), "--quick",
                        "--json", str(out)], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    assert "recursive / copy" in p.stdout and "20 MB" in p.stdout
    import json
    res = json.loads(out.read_text())
    assert res["snapshot"]["ratio_min"] > 5  # the walk is far slower than flat copies
    big = res["shm"][-1]
    assert big["bytes"] == 20 << 20 and big["pool"]["GBps"] > big["per-chunk"]["GBps"]
