"""A real Prometheus (the Debian package) for tests: start one scraping a target, ask its
HTTP API, wait for an answer."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.otlp_receiver import free_port

PROMETHEUS = shutil.which("prometheus") or "prometheus"
PROMTOOL = shutil.which("promtool") or "promtool"
# Native histograms on: Prometheus scrapes protobuf and stores omnitrace's histograms as
# native series; off: it scrapes text and stores the classic _bucket/_sum/_count series.
FLAVOURS = {"native": "exemplar-storage,native-histograms", "classic": "exemplar-storage"}


def start(tmp: Path, target_port: int, flavour: str) -> tuple[subprocess.Popen, int]:
    """A Prometheus scraping 127.0.0.1:target_port every second; (process, API port)."""
    pport = free_port()
    cfg = tmp / f"prometheus-{flavour}.yml"
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                   "scrape_configs:\n  - job_name: omnitrace\n"
                   f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / ('data-' + flavour)}",
                             f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn",
                             f"--enable-feature={FLAVOURS[flavour]}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, pport


def get(url: str, accept: str | None = None, timeout: float = 5.0) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def api(pport: int, path: str, **params) -> list | dict:
    url = f"http://127.0.0.1:{pport}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
    body = json.loads(get(url))
    assert body["status"] == "success", body
    return body["data"]


def number(row: dict) -> float:
    """An instant vector sample's number: its value, or a native histogram's count."""
    if "histogram" in row:
        return float(row["histogram"][1]["count"])
    return float(row["value"][1])


def query(pport: int, expr: str, **params) -> list:
    """The instant vector's samples that carry a number (histogram_quantile of an empty
    window is NaN)."""
    return [r for r in api(pport, "query", query=expr, **params)["result"] if math.isfinite(number(r))]


def wait(what, timeout: float, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(step)
