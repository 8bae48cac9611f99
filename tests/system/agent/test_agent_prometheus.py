"""A real Prometheus (Debian package) scrapes the agent's endpoint; PromQL answers."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.support.agent_util import WRITER, clean_env
from tests.support.otlp_receiver import free_port
from tests.support.system_deps import need

PROMETHEUS = shutil.which("prometheus") or "prometheus"


@pytest.fixture(autouse=True, scope="module")
def _prometheus_installed():
    need("prometheus", "prometheus")


def _get(url: str, timeout: float = 2.0) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def _query(pport: int, q: str) -> list:
    url = f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    return json.loads(_get(url))["data"]["result"]


def test_prometheus_scrapes_fifo_residence(tmp_path):
    mport, pport = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n  - job_name: omnitrace\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{mport}']}}]\n")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn",
                             "--enable-feature=exemplar-storage"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the command keeps the agent (and its endpoint) up while Prometheus scrapes: it
    # writes several rounds of real events, then waits for the test to tell it to stop
    stop = tmp_path / "stop"
    script = (f"import subprocess, sys, time, os\n"
              f"i = 0\n"
              f"while not os.path.exists({str(stop)!r}):\n"
              f"    subprocess.check_call([sys.executable, {WRITER!r}, {str(tmp_path / 'w.json')!r},"
              f" '--requests', '3', '--chunks', '2', '--prefix', f'r{{i}}'])\n"
              f"    i += 1; time.sleep(0.5)\n")
    run = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir",
                            str(tmp_path / "run"), "--exporter", "prometheus",
                            "--prometheus-port", str(mport), "--", "python", "-c", script],
                           env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        q = ("histogram_quantile(0.99, sum by (le, stage) "
             "(rate(omnitrace_fifo_residence_seconds_bucket[1m])))")
        deadline, result = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            try:
                result = [r for r in _query(pport, q) if r["value"][1] not in ("NaN",)]
            except OSError:
                result = []
            if result:
                break
            time.sleep(0.5)
        assert result, "no histogram_quantile result from Prometheus"
        assert {r["metric"]["stage"] for r in result} == {"0"}
        assert float(result[0]["value"][1]) > 0
        # the endpoint binds 127.0.0.1 and exposes trace-id exemplars (OpenMetrics)
        body = _get(f"http://127.0.0.1:{mport}/metrics").decode()
        assert 'omnitrace_fifo_residence_seconds_bucket{' in body
        assert '# {trace_id="' in body
        for metric in ("omnitrace_request_ttfp_seconds_bucket", "omnitrace_transfer_put_duration_seconds_bucket",
                       "omnitrace_snapshot_duration_seconds_bucket", "omnitrace_fifo_blocked_seconds_bucket",
                       "omnitrace_transfer_get_duration_seconds_bucket", "omnitrace_transfer_size_bytes_bucket",
                       "omnitrace_events_total"):
            assert metric in body, metric
        assert 'le="1e-05"' in body and 'le="30.0"' in body
    finally:
        stop.write_text("1")
        out, err = run.communicate(timeout=60)
        prom.send_signal(signal.SIGTERM)
        prom.wait(20)
    assert run.returncode == 0, err
    assert os.path.getsize(tmp_path / "run" / "metrics.jsonl") > 0
