"""The report names the server's failures as failures: SIGKILL of a real stage process
mid-load (the talker), then `omnitrace report` names the stage death and counts every
failed request under it, and keeps "no trace" for requests that truly have none."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from tests.support.report_util import _env

from omnitrace.bench.serve_and_bench import free_port


def _health(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return json.loads(r.read())
    except Exception:
        return None


def test_stage_killed_mid_load_is_named_with_its_failed_requests(tmp_path):
    d = tmp_path / "killed"
    port = free_port()
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", str(d), "--", sys.executable, "-m",
           "omnitrace.bench.serve_and_bench", "--port", str(port), "--", "--no-progress",
           "--concurrency", "4", "--warmup", "0", "--num-prompts", "80", "--input-len", "100",
           "--output-len", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        deadline = time.monotonic() + 120
        talker, loaded = None, None
        while time.monotonic() < deadline and talker is None and proc.poll() is None:
            h = _health(port)
            if h and h.get("in_flight", 0) > 0 and loaded is None:
                loaded = time.monotonic()
            if loaded is not None and time.monotonic() - loaded > 3:  # some requests done
                talker = next(s["pid"] for s in h["stages"] if s["name"] == "talker")
            time.sleep(0.1)
        assert talker, "the load never started"
        os.kill(talker, signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "died" in out
    bench = json.loads((d / "bench.json").read_text())
    failed = [r for r in bench["requests"] if r["error"]]
    assert failed and bench["status"] == "complete-with-errors"
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", str(d), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 3) and "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)
    fl = rep["failures"]
    assert [x["stage"] for x in fl["stage_deaths"]] == ["1 (talker)"]
    assert fl["failed"] == len(failed) == rep["window"]["failed"]
    (cause,) = fl["causes"]
    assert cause["cause"] == "stage 1 (talker) died" and cause["count"] == len(failed)
    assert any(w.startswith("STAGE 1 (talker) DIED") for w in rep["warnings"])
    assert not any("no trace" in w for w in rep["warnings"]), rep["warnings"]
    text = subprocess.run([sys.executable, "-m", "omnitrace", "report", str(d)], capture_output=True,
                          text=True, timeout=120).stdout
    assert f"{len(failed)} measured request(s) FAILED: {len(failed)} stage 1 (talker) died" in text
