"""--flame on the REAL vLLM-Omni classes (``tests/support/vllm_driver.py``: a producer adapter in
the driver process, a consumer in a spawned ``StageEngineCoreProc_stage1_replica0``).

Must hold: both stage processes get profiles named by stage; the time per snapshot call
read off the samples (time in ``_snapshot_processor_request`` on the scheduler thread over
the calls the spans counted) is within 25% of the spans' own mean, on 0.30 and 0.32, and
the two measures agree on how much the fix saved per call (both within 25%, or the sampling
error of the samples that showed the function where wider). Seen in six runs (32 requests,
32 or 96 chunks, 250 Hz): ms per call from the samples within -22%..+15% of the spans'
(0.30.0 0.31-0.54 ms, 0.32.0rc1 0.065-0.28 ms; with 32 chunks 0.32 had 4-20 samples in the
function, so the runs use 96). The per-call drop is 1.9-4.7x here, not the >= 5x of the
real server (``tests/test_vllm_serve.py``, p50 per call), because in this driver the save
thread serialises a tensor per chunk beside the scheduler and 0.32's short call often waits for
the GIL inside its span. The share of the producer's
samples in the function (0.30 42-62%, 0.32 5-34%) moves with the machine's load, so it is
printed; asserted: 0.30's share >= 20% and above 0.32's. vLLM-Omni's hooks record the
scheduler's snapshot and enqueue stamps from the save thread, so the scheduler has no ring
of its own: its samples are found as the main thread (native id = pid).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.vllm_venvs import DRIVER, ROOT, _omni_version, _venvs

ARGS = ["--requests", "32", "--chunks", "96", "--prompt-tokens", "2500"]


def _share(run_dir: Path, pid: int, function: str) -> tuple[float, int]:
    """Share of the samples of the process's main thread (its scheduler) whose stack holds
    ``function``, and the sample count: what `omnitrace flame RUN --stage 0 --thread
    scheduler` draws."""
    from omnitrace.profile.store import Store
    store = Store.load(str(run_dir / "profiles" / "samples.npz"))
    mask = (store.stretches["pid"] == pid) & (store.stretches["tid"] == pid)
    idx, _ = store.samples(mask)
    hit = np.array([any(store.frames[f][0].endswith(function) for f in store.stacks[s])
                    for s in range(len(store.stacks))], bool)
    inside = hit[store.stretches["stack"][idx]]
    return float(inside.mean()) if len(idx) else 0.0, int(len(idx))


def _per_call_ms(run_dir: Path, pid: int, function: str, calls: int) -> tuple[float, int]:
    """Time in ``function`` on the process's main thread, from the samples alone (each
    stretch of one stack weighted by its duration, as the per-process profile is), over the
    number of calls the spans counted; and how many samples showed the function."""
    from omnitrace.profile.store import Store
    store = Store.load(str(run_dir / "profiles" / "samples.npz"))
    st = store.stretches
    rows = (st["pid"] == pid) & (st["tid"] == pid)
    hit = np.array([any(store.frames[f][0].endswith(function) for f in store.stacks[s])
                    for s in range(len(store.stacks))], bool)
    rows &= hit[st["stack"]]
    n = len(store.samples(rows)[0])
    return float((st["end"][rows] - st["t"][rows]).sum()) / 1e6 / calls, n


def _run(venv: Path, run_dir: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir), "--flame",
                        "--flame-rate", "250", "--",
                        str(venv / "bin" / "python"), str(DRIVER), *ARGS],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    index = json.loads((run_dir / "profiles" / "index.json").read_text())
    return index


@pytest.mark.vllm
def test_stage_profiles_and_snapshot_share_030_vs_032(tmp_path: Path) -> None:
    by_version: dict[str, tuple[float, float]] = {}
    per_call: dict[str, tuple[float, float, int]] = {}  # version -> ms from samples, from spans; samples
    venvs = _venvs()
    if not venvs:
        pytest.skip("no vLLM-Omni venv: run scripts/install-vllm-omni.sh .venv-vllm 0.30.0")
    for venv in venvs:
        run_dir = tmp_path / venv.name
        index = _run(venv, run_dir)
        names = {p["name"]: p for p in index["profiles"]}
        assert set(names) == {"stage0", "stage1"}, index
        assert index["missing"] == []
        assert names["stage1"]["process"] == "StageEngineCoreProc_stage1_replica0"
        pid = names["stage0"]["pid"]
        by_version[_omni_version(venv)] = _share(run_dir, pid, "_snapshot_processor_request")
        # the span-linked view joins on the real classes: the snapshot spans are found and
        # samples of the scheduler (the main thread: no ring of its own there) fall in them
        r = subprocess.run([sys.executable, "-m", "omnitrace", "flame", str(run_dir), "--stage", "0",
                            "--category", "snapshot", "-o", str(run_dir / "snap"), "--json"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert summary["spans"] > 0 and summary["samples"] > 0, summary
        spans_ms = summary["interval_s"] * 1e3 / summary["spans"]  # one thread: no overlap
        ms, n = _per_call_ms(run_dir, pid, "_snapshot_processor_request", summary["spans"])
        per_call[_omni_version(venv)] = (ms, spans_ms, n)
    for v, (share, ms) in sorted(by_version.items()):
        print(f"\n{v}: producer scheduler thread {share:.1%} of {ms} samples in _snapshot_processor_request; "
              f"per call {per_call[v][0]:.3f} ms from samples, {per_call[v][1]:.3f} ms from spans")
    for v, (sampled, spans_ms, n) in per_call.items():  # the per-call cost read off the flame graph
        # within 25%, or the sampling error of n samples where wider (0.32's calls are
        # short: a few dozen samples at 250 Hz)
        assert sampled == pytest.approx(spans_ms, rel=max(0.25, 2.5 / np.sqrt(max(n, 1)))), (v, per_call)
    old = [s for v, (s, _) in by_version.items() if v.startswith("0.30")]
    new = [s for v, (s, _) in by_version.items() if v.startswith("0.32")]
    if not old or not new:
        pytest.skip(f"needs both 0.30 and 0.32 venvs (have {sorted(by_version)})")
    assert old[0] >= 0.2, by_version  # the recursive walk is most of the producer's work
    assert old[0] > new[0], by_version  # the factor itself: printed above, see the docstring
    # what the fix saved per call, read off the samples as off the spans (1.9-4.7x here: see
    # the docstring)
    (o_samp, o_span, _), (n_samp, n_span, n) = (next(per_call[v] for v in per_call if v.startswith(x))
                                                for x in ("0.30", "0.32"))
    assert o_span > n_span and o_samp / n_samp == pytest.approx(
        o_span / n_span, rel=max(0.25, 2.5 / np.sqrt(max(n, 1)))), per_call
