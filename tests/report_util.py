"""Run the real reference pipeline + bench under `omnitrace run`, and report on it."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import yaml

from omnitrace.runtime import config

CHROMIUM = "/usr/bin/chromium"


def chromium() -> str:
    """Debian's Chromium (Playwright drives it); the test fails naming the package if missing."""
    from tests.system_deps import need
    return need("chromium", "chromium", CHROMIUM)
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pipeline_file(path: str, **stage_overrides: dict) -> str:
    """The packaged pipeline with per-stage overrides, e.g. talker={"inject_put_delay_ms": 20}."""
    cfg = config.to_dict(config.load())
    for st in cfg["stages"]:
        st.update(stage_overrides.get(st["name"], {}))
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def run_pipeline(run_dir: str, bench_args: list[str], serve_args: str = "", timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", run_dir, "--",
           sys.executable, "-m", "omnitrace.bench.serve_and_bench", "--serve", serve_args, "--",
           "--no-progress", *bench_args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    assert r.returncode == 0, f"omnitrace run failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def report_json(*run_dirs: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", *run_dirs, "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
