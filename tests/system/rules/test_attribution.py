"""`omnitrace report --json` and `--html` run on the hand-written three-stage trace. Its
attribution arithmetic, in process: tests/unit/rules/test_attribution.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.event_fixture import three_stage_events, write_event_run


def test_json_and_html_cli(tmp_path):
    d = write_event_run(str(tmp_path / "r"), three_stage_events("a"))
    out = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["requests"][0]["id"] == "a"
    html = tmp_path / "r.html"
    out = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--html", str(html)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = html.read_text()
    assert "<script src=" not in text and "Plotly" in text and os.path.getsize(html) > 1_000_000
