"""`omnitrace run --flame` on the reference pipeline under load, as the flame tests run it."""
from __future__ import annotations

import os
import subprocess
import sys


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def flame_run(run_dir: str, bench: list[str], serve: str, *flame_args: str,
              timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", run_dir, "--flame", *flame_args,
           "--", sys.executable, "-m", "omnitrace.bench.serve_and_bench", "--serve", serve, "--", *bench]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    assert r.returncode == 0, f"omnitrace run failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r
