"""--flame on the REAL vLLM-Omni classes (``tests/support/vllm_driver.py``: a producer adapter in
the driver process, a consumer in a spawned ``StageEngineCoreProc_stage1_replica0``).

Must hold: both stage processes get profiles named by stage; the time per snapshot call
read off the samples (time in ``_snapshot_processor_request`` on the scheduler thread over
the calls the spans counted) is within 25% of the spans' own mean, on 0.30 and 0.32 (or
2.5 times its sampling error where wider: py-spy's gaps are random, so ~100 samples give
±14%, not the ±10% of 1/sqrt(n), which one CI run beside a core burner exceeded with
0.32's 0.043 ms against 0.034 from 96 samples); and the fix's saving per call,
0.30 -> 0.32, is >= 5x at the spans' median (the means, from samples and spans, are
printed: beside a core burner one run read 4.3x from the spans' means and 4.5x from the
samples, 0.32's call averaging 0.217 ms with GIL waits inside it).

The driver's scheduler pauses 20 ms between steps, as a model's forward would (the real
tiny Qwen3-Omni's thinker steps take tens of ms on this CPU), so the save thread sends a
step's chunks between steps. With 2 ms pauses it sent all the time and 0.32's short call
often waited for the GIL inside its span: 0.065-0.28 ms a call instead of ~0.025, a drop
of only 1.9-4.7x, where the real server's spans give >= 5x at p50
(``tests/system/vllm/test_vllm_serve.py``). Seen here with 256 chunks a request (250 Hz): 0.30
0.32-0.34 ms a call, 0.32 0.020-0.027 ms (~40 samples in the function); the drop 12.6-16.9x
from the samples, 11.9-12.3x from the spans; beside a core burner 21.5x / 14.6x (0.32's
call read 37% low from its 41 samples), so the runs use 384 chunks. The share of the producer's
samples in the function moves with the machine's load, so it is printed; asserted: 0.30's
share >= 20% and above 0.32's. vLLM-Omni's hooks record the scheduler's snapshot and
enqueue stamps from the save thread, so the scheduler has no ring of its own: its samples
are found as the main thread (native id = pid).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.flame_run import tolerance
from tests.support.vllm_venvs import DRIVER, ROOT, _omni_version, _venvs

ARGS = ["--requests", "32", "--chunks", "384", "--prompt-tokens", "2500", "--step-ms", "20"]


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


def _per_call_ms(run_dir: Path, pid: int, function: str, calls: int) -> tuple[float, float]:
    """Time in ``function`` on the process's main thread, from the samples alone (each
    stretch of one stack weighted by its duration, as the per-process profile is), over the
    number of calls the spans counted; and the time's sampling error (%, the product's own
    estimate from those durations: py-spy's gaps are random, so ~sqrt(2/n), not 1/sqrt(n))."""
    from omnitrace.profile.linked import sampling_error_pct
    from omnitrace.profile.store import Store
    store = Store.load(str(run_dir / "profiles" / "samples.npz"))
    st = store.stretches
    rows = (st["pid"] == pid) & (st["tid"] == pid)
    hit = np.array([any(store.frames[f][0].endswith(function) for f in store.stacks[s])
                    for s in range(len(store.stacks))], bool)
    rows &= hit[st["stack"]]
    secs = (st["end"][rows] - st["t"][rows]) / 1e9
    return float(secs.sum()) * 1e3 / calls, sampling_error_pct(secs) or 100.0


def _median_snapshot_ms(run_dir: Path) -> float:
    """The producer's snapshot spans' median, from the run's tables: a mean would count in
    full the GIL waits a few short calls suffer on a loaded machine."""
    r = subprocess.run([sys.executable, "-m", "omnitrace", "sql", "--format", "json", str(run_dir),
                        "SELECT median(dur_ns) AS ns FROM snapshots WHERE producer_stage = 0 "
                        "AND incomplete IS NULL"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]["ns"] / 1e6


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
    # version -> per call: ms from samples, from the spans' mean, the sampling error %, the spans' median ms
    per_call: dict[str, tuple[float, float, float, float]] = {}
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
        ms, err = _per_call_ms(run_dir, pid, "_snapshot_processor_request", summary["spans"])
        per_call[_omni_version(venv)] = (ms, spans_ms, err, _median_snapshot_ms(run_dir))
    for v, (share, ms) in sorted(by_version.items()):
        print(f"\n{v}: producer scheduler thread {share:.1%} of {ms} samples in _snapshot_processor_request; "
              f"per call {per_call[v][0]:.3f} ms from samples (±{per_call[v][2]:.0f}%), "
              f"{per_call[v][1]:.3f} ms from spans")
    for v, (sampled, spans_ms, err, _) in per_call.items():  # the per-call cost read off the flame graph
        # within 25%, or 2.5 sampling errors where wider (0.32's calls are short: ~100
        # samples at 250 Hz, ±14%)
        assert sampled == pytest.approx(spans_ms, rel=tolerance(0.25, err)), (v, per_call)
    old = [s for v, (s, _) in by_version.items() if v.startswith("0.30")]
    new = [s for v, (s, _) in by_version.items() if v.startswith("0.32")]
    if not old or not new:
        pytest.skip(f"needs both 0.30 and 0.32 venvs (have {sorted(by_version)})")
    assert old[0] >= 0.2, by_version  # the recursive walk is most of the producer's work
    assert old[0] > new[0], by_version  # the factor itself: printed above, see the docstring
    # what the fix saved per call: asserted on the spans' medians; the means (samples' and
    # spans') stated, as GIL waits inside 0.32's short call count in them in full
    (o_samp, o_span, _, o_med), (n_samp, n_span, _, n_med) = (
        next(per_call[v] for v in per_call if v.startswith(x)) for x in ("0.30", "0.32"))
    print(f"per-call drop 0.30 -> 0.32: {o_med / n_med:.1f}x from the spans' medians ({o_med:.3f} -> "
          f"{n_med:.3f} ms); means: {o_samp / n_samp:.1f}x from the samples, {o_span / n_span:.1f}x from the spans")
    assert o_med >= 5 * n_med, per_call
