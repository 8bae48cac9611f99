"""Model Runner V2's native data plane and talker-first audio on the REAL vLLM-Omni classes.

MRv2 does not start on this CPU-only machine (docs/vllm-omni.md says why), so
``tests/support/vllm_mrv2_driver.py`` drives its real classes through their own code paths
under ``omnitrace run``: a producer ``OmniRunnerDataPlane`` (stage 1, talker: its bounded
output queue, output-worker and save threads, delivery tickets, a real
SharedMemoryConnector), a consumer plane (stage 2, code2wav, a spawned process) feeding a
real ``OmniSchedulingCoordinator``, the real ``FirstAudioSender`` (0.32 on) and a delivery
ticket nobody delivers. What omnitrace recorded per request is checked against an
independent count: the segments the connector really created and unlinked in /dev/shm
(inotify, ``tests/support/shm_watcher.py``) and the driver's own counts (batches it
enqueued, builder calls: one per snapshot, chunks the consumer picked up, first audio
packets it took off the engine's output queue).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from omnitrace import conventions as cv
from omnitrace import eventlog
from tests.support.agent_util import read_spans
from tests.support.shm_watcher import ShmWatcher
from tests.support.vllm_venvs import MRV2_DRIVER, _venvs, hooked_paths, omnitrace_warnings, run_driver

E = cv.Ev
TALKER, CODE2WAV = 1, 2
STEPS = 6  # the driver's default: batches per request
QUEUE_BOUND = 8  # vLLM-Omni's _NATIVE_OUTPUT_QUEUE_DEPTH


def _params() -> list[Any]:
    """(venv, builder): the scalar builder where omnitrace hooks the MRv2 data plane (0.30
    on), the batch builder too where it hooks talker-first audio (0.32 on)."""
    out = []
    for v in _venvs():
        paths = hooked_paths(v)
        if cv.PATH_MRV2 in paths:
            out.append(pytest.param(v, "scalar", id=f"{v.name}-scalar"))
        if cv.PATH_TALKER_FIRST_AUDIO in paths:
            out.append(pytest.param(v, "batch", id=f"{v.name}-batch"))
    return out or [pytest.param(None, None, marks=pytest.mark.skip(
        reason="no vLLM-Omni venv with MRv2 hooks (0.30+): run scripts/install-vllm-omni.sh"))]


class Recorded:
    """The run's events, as the event log holds them (not rebuilt spans)."""

    def __init__(self, run_dir: Path) -> None:
        log = eventlog.read_event_log(str(run_dir))
        assert log is not None, f"{run_dir} has no event log"
        names = log.requests.strings
        self.rows = [(E(int(e["kind"])), names[int(e["req"])], int(e["stage"]), int(e["chunk"]), int(e["a"]),
                      int(e["b"]), int(e["t"])) for e in log.events]
        self.count = Counter((k, r, s) for k, r, s, *_ in self.rows)

    def of(self, kind: E, rid: str, stage: int) -> list[tuple]:
        return sorted((row for row in self.rows if row[:3] == (kind, rid, stage)), key=lambda row: row[6])


_runs: dict[tuple[str, str], tuple] = {}


def mrv2_run(venv: Path, builder: str, tmp_root: Path) -> tuple:
    """One instrumented driver run per (venv, builder), watched in /dev/shm; shared below."""
    key = (str(venv), builder)
    if key not in _runs:
        run_dir = tmp_root / f"mrv2-{venv.name}-{builder}"
        watcher = ShmWatcher()
        try:
            proc, out = run_driver(venv, run_dir, "--builder", builder, driver=MRV2_DRIVER, timeout=900)
        finally:
            watcher.stop()
        _runs[key] = (proc, out, watcher, run_dir)
    return _runs[key]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-mrv2")


def _api_id(ext: str) -> str:
    """The id omnitrace records: the client's, without the route's and engine's affixes."""
    return ext.removeprefix("chatcmpl-").rsplit("-", 1)[0]


def _ok(proc: subprocess.CompletedProcess, out: dict | None) -> dict:
    # the driver's counts first: its stderr ends in the resource tracker's warnings about the
    # producer's segments, which the consumer unlinked (on every run)
    counts = {k: v for k, v in (out or {}).items() if k in ("done", "picked", "gets", "batches", "builder_calls")}
    stderr = "\n".join(ln for ln in proc.stderr.splitlines() if "resource_tracker" not in ln)
    assert proc.returncode == 0, f"{counts}\n{stderr[-3000:]}"
    assert out is not None and "error" not in out, proc.stdout[-2000:]
    assert out["done"] and out["consumer_exit"] == 0, out
    assert not omnitrace_warnings(proc.stderr), omnitrace_warnings(proc.stderr)
    return out


@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("venv,builder", _params())
def test_mrv2_counts_equal_the_connectors_and_the_drivers(venv: Path, builder: str, tmp_root: Path) -> None:
    proc, out, watcher, run_dir = mrv2_run(venv, builder, tmp_root)
    out = _ok(proc, out)
    rec = Recorded(run_dir)
    created, removed = watcher.chunks(watcher.created), watcher.chunks(watcher.removed)
    for ext in out["ext_ids"]:
        rid = _api_id(ext)
        puts = created[(ext, TALKER)]
        # the connector's own record: every chunk written once, read (and unlinked) once
        assert puts == removed[(ext, TALKER)] == out["gets"][ext] == out["picked"][ext] > 0, (ext, out)
        assert rec.count[(E.PUT_END, rid, TALKER)] == rec.count[(E.PUT_BEGIN, rid, TALKER)] == puts
        assert rec.count[(E.GET_END, rid, CODE2WAV)] == rec.count[(E.GET_BEGIN, rid, CODE2WAV)] == puts
        # the output queue: one task per batch the model thread enqueued with this request
        assert rec.count[(E.FIFO_ENQUEUE, rid, TALKER)] == rec.count[(E.FIFO_DEQUEUE, rid, TALKER)] \
            == out["batches"][ext] == STEPS
        # one snapshot and one payload build per builder call; a build that led to a chunk
        # carries its bytes, one that did not (request 1's zero-frame step) carries 0
        calls = out["builder_calls"][ext]
        assert rec.count[(E.SNAPSHOT_END, rid, TALKER)] == rec.count[(E.PROCESS_END, rid, TALKER)] == calls
        made = [row for row in rec.of(E.PROCESS_END, rid, TALKER) if row[4] > 0]
        assert len(made) == puts and calls - puts == (1 if ext == out["ext_ids"][1] else 0)
        assert {row[5] for row in rec.of(E.FIFO_DEQUEUE, rid, TALKER)} == {CODE2WAV}  # b = consumer
        # the consumer: every chunk it read made ready, every pickup scheduled
        assert rec.count[(E.CHUNK_READY, rid, CODE2WAV)] == out["gets"][ext]
        assert rec.count[(E.CHUNK_SCHEDULED, rid, CODE2WAV)] == out["picked"][ext]
        if out["first_audio"] is not None:  # the talker's own first audio packet (0.32 on)
            emits = [row for row in rec.of(E.STAGE_EMIT, rid, TALKER) if row[5] == int(cv.Modality.AUDIO)]
            assert len(emits) == out["first_audio"].get(ext, 0), (ext, emits, out["first_audio"])
    if out["first_audio"] is not None:  # one row not audio, one id without a route: not delivered
        assert sorted(out["first_audio"]) == sorted(out["ext_ids"][:2])
    timeouts = [row for row in rec.rows if row[0] == E.DELIVERY_TIMEOUT]
    assert out["timeout"] == "DeliveryTimeoutError"
    assert [row[1:5] for row in timeouts] == [(_api_id(out["ext_ids"][0]), TALKER, 99, 50)]
    applied = set(out["patching"]["applied"])
    assert "vllm_omni.worker_v2.omni_data_plane.OmniRunnerDataPlane.complete_outputs" in applied


@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("venv,builder", _params())
def test_mrv2_output_queue_residence_and_depth_against_the_drivers_stamps(venv: Path, builder: str,
                                                                          tmp_root: Path) -> None:
    """The model thread enqueues every batch while the output worker is held in the first
    batch's builder (the driver's gate): each FIFO_ENQUEUE lies in its ``enqueue_outputs``
    call, every later batch leaves the queue after the gate opened, and the last batch had
    all but the first ahead of it (the queue's bound never passed)."""
    proc, out, _watcher, run_dir = mrv2_run(venv, builder, tmp_root)
    out = _ok(proc, out)
    rec = Recorded(run_dir)
    perf, wall = out["anchor"]
    tol = 1_000_000  # 1 ms: the clock conversion and the stamps' distance from the calls

    def to_wall(t: int) -> int:
        return wall + (t - perf)

    windows = [(to_wall(a), to_wall(b)) for a, b in out["enqueue_windows"]]
    opened = to_wall(out["gate_opened"])
    for ext in out["ext_ids"]:
        enq = rec.of(E.FIFO_ENQUEUE, _api_id(ext), TALKER)
        deq = rec.of(E.FIFO_DEQUEUE, _api_id(ext), TALKER)
        for k, ((w0, w1), e, d) in enumerate(zip(windows, enq, deq)):
            assert w0 - tol <= e[6] <= w1 + tol, (ext, k, e, w0, w1)
            assert e[6] <= d[6] and 0 <= e[4] <= QUEUE_BOUND and 0 <= d[4] <= QUEUE_BOUND
            if k > 0:
                assert d[6] >= opened - tol, (ext, k, d, opened)
        assert enq[-1][4] >= STEPS - 2, [e[4] for e in enq]


@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("venv,builder", _params())
def test_mrv2_chunk_spans_follow_the_data_planes_order(venv: Path, builder: str, tmp_root: Path) -> None:
    """Per chunk, the spans `omnitrace export` rebuilds: the output worker takes the batch,
    snapshots, builds, then the save thread puts (the bytes the build led to) and the
    consumer's get ends after the put began; the consumer's wait to schedule closes."""
    proc, out, _watcher, run_dir = mrv2_run(venv, builder, tmp_root)
    out = _ok(proc, out)
    spans: dict[tuple, list[dict]] = {}
    for s in read_spans(str(run_dir)):
        a = s["attrs"]
        key = (s["name"], a.get(cv.ATTR_REQUEST_ID), a.get(cv.ATTR_STAGE_ID), a.get(cv.ATTR_CHUNK_INDEX))
        spans.setdefault(key, []).append({"start": int(s["startTimeUnixNano"]), "end": int(s["endTimeUnixNano"]),
                                          "bytes": a.get(cv.ATTR_TRANSFER_BYTES, 0),
                                          "incomplete": a.get(cv.ATTR_INCOMPLETE, False)})
    checked = 0
    for ext in out["ext_ids"]:
        rid = _api_id(ext)
        for chunk in range(out["gets"][ext]):
            (put,) = spans[(cv.SPAN_PUT, rid, TALKER, chunk)]
            (get,) = spans[(cv.SPAN_GET, rid, CODE2WAV, chunk)]
            (proc_,) = [p for p in spans[(cv.SPAN_PROCESS, rid, TALKER, chunk)] if p["bytes"] > 0]
            snap = max((x for x in spans[(cv.SPAN_SNAPSHOT, rid, TALKER, chunk)] if x["end"] <= proc_["start"]),
                       key=lambda x: x["end"])
            assert snap["start"] <= snap["end"] <= proc_["start"] <= proc_["end"] <= put["start"] <= put["end"]
            assert put["start"] <= get["end"] and proc_["bytes"] == put["bytes"] == get["bytes"]
            fifo = [f for f in spans.get((cv.SPAN_FIFO, rid, TALKER, chunk), ()) if f["end"] <= snap["start"]]
            if chunk < out["gets"][ext] - 1:  # the terminal marker leaves outside the queue
                assert fifo, (rid, chunk)
            (wait,) = spans[(cv.SPAN_WAIT_SCHEDULE, rid, CODE2WAV, chunk)]
            assert not wait["incomplete"] and get["end"] <= wait["start"]
            checked += 1
    assert checked == sum(out["gets"].values())


@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("venv,builder", _params())
def test_mrv2_run_reports_its_figures_and_the_delivery_timeout(venv: Path, builder: str, tmp_root: Path) -> None:
    """The harness has no API request, so no TTFP to attribute: `omnitrace report` gives the
    talker's FIFO, snapshot and transfer figures (from the same counts as above) and names
    the delivery timeout first."""
    proc, out, watcher, run_dir = mrv2_run(venv, builder, tmp_root)
    out = _ok(proc, out)
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", str(run_dir), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["window"]["api_requests"] is False and rep["window"]["measured"] == len(out["ext_ids"])
    (fifo,) = [f for f in rep["fifo"] if f["stage_id"] == TALKER]
    assert fifo["count"] == sum(out["batches"].values()) and fifo["depth_max"] >= STEPS - 2
    (snap,) = rep["snapshot"]
    assert snap["stage_id"] == TALKER and snap["count"] == sum(out["builder_calls"].values())
    ours = sum(n for (req, stage), n in watcher.chunks(watcher.created).items()
               if req in out["ext_ids"] and stage == TALKER)
    (pair,) = rep["transfer"]
    assert pair["pair"] == f"{TALKER}->{CODE2WAV}" and pair["put"]["count"] == pair["get"]["count"] == ours
    (timeout,) = rep["failures"]["delivery_timeouts"]
    assert (timeout["stage_id"], timeout["request"], timeout["chunk"]) == (TALKER, _api_id(out["ext_ids"][0]), 99)
    # the stage is named where the run has a span of it (0.32: the talker's first audio)
    assert re.match(r"STAGE 1( \(talker\))?: 1 CONNECTOR DELIVERY TIMED OUT", rep["warnings"][0]), rep["warnings"]
