"""`omnitrace run --flame` on the reference pipeline under load, as the flame tests run it."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np


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


def may_run_realtime() -> bool:
    """CAP_SYS_NICE (or an RLIMIT_RTPRIO), as a child process finds out (root in a
    container may lack it)."""
    return subprocess.run([sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"],
                          capture_output=True).returncode == 0


def within_sampling_error(summary: dict, truth: float) -> bool:
    """What a selection's samples alone read (`omnitrace flame --json` ``sampled_s``: the
    seconds each stands for; the selection's ``seconds`` are the spans' own, exact) against
    the spans' own time: within 10%, or 2.5 times the sampling error the selection states
    where that is wider (each sample that falls in a short span stands for a whole gap: the
    error goes as 1/sqrt(samples) or more; ~100 samples in the suite's short runs;
    benchmarks/flame_results.md measures the 10% on a longer load). The samples catch the
    spans' time: their split of it can be trusted."""
    err = summary.get("sampling_error_pct") or 100 / np.sqrt(max(summary["samples"], 1))
    return abs(summary["sampled_s"] - truth) <= tolerance(0.10, err) * truth + 1e-3  # seconds: to the ms


def tolerance(floor: float, sampling_error_pct: float) -> float:
    """The relative tolerance of a figure read off samples: ``floor``, or 2.5 times its
    sampling error (one sigma, %) where that is wider."""
    return max(floor, 2.5 * sampling_error_pct / 100)
