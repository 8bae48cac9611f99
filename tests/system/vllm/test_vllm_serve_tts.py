"""The REAL vLLM-Omni server under omnitrace on the CPU with a second model family: a tiny
random-weight Qwen3-TTS (talker ``qwen3_tts`` -> ``code2wav``, async chunks over shared
memory, model runner v1) on ``/v1/audio/speech``.

Needs a 0.32 venv made by ``scripts/install-vllm-omni.sh --serve-cpu`` (its CPU platform
plugin); the tiny model is built here by ``demo/vllm-omni-cpu/make_tiny_qwen3_tts.py``
(~10 s). One server start (~3-5 min on 2 cores) under ``omnitrace run``: ``omnitrace
loadtest --base-url`` in speech mode (c=4, 16 measured requests), then vLLM-Omni's own
``openai-audio-speech`` request function, then the server's own shutdown. The witnesses
omnitrace does not produce: the chunk segments the server created and removed in /dev/shm
(inotify), the audio bytes each client received, and vLLM-Omni's client's AUDIO_TTFP.
Marked ``vllm_serve``: not in the default run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from omnitrace.bench.serve_and_bench import free_port, wait_healthy
from omnitrace.inject.leftovers import request_of
from tests.support.shm_watcher import CHUNK_KEY, ShmWatcher
from tests.support.vllm_venvs import ROOT, _omni_version, _venvs

MODEL_NAME = "tiny-tts"
FRAME_BYTES = 1920 * 2  # one 12.5 Hz codec frame: 1920 PCM16 samples at 24 kHz
LOAD = ["--backend", "openai-audio-speech", "--concurrency", "4", "--num-prompts", "16", "--warmup", "4",
        "--input-len", "20", "--output-len", "40"]
pytestmark = [pytest.mark.vllm_serve, pytest.mark.timeout(1800)]


def _venv() -> Path:
    for v in _venvs():
        if _omni_version(v).startswith("0.32.") and (v / "bin" / "vllm").exists() and subprocess.run(
                [str(v / "bin" / "python"), "-c", "import omni_cpu_platform"], capture_output=True).returncode == 0:
            return v
    pytest.skip("no CPU-serving vLLM-Omni 0.32 venv: VLLM_OMNI_TORCH=pypi scripts/install-vllm-omni.sh "
                "--serve-cpu .venv-vllm-032 0.32.0rc1")


def _env(venv: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}")
    env.pop("OMNITRACE_RUN_ID", None)
    return env


def _ot(venv: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "omnitrace", *args], env=_env(venv), text=True,
                          capture_output=True, cwd=ROOT, **kw)


def _stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=180)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def served_tts(tmp_path_factory) -> dict:
    venv = _venv()
    tmp = tmp_path_factory.mktemp("tts032")
    made = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "demo" / "vllm-omni-cpu" / "make_tiny_qwen3_tts.py"),
                           str(tmp / "tiny")], env=_env(venv), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    run_dir, port = tmp / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed below)
    watcher = ShmWatcher()
    server = subprocess.Popen(
        [str(venv / "bin" / "python"), "-m", "omnitrace", "run", "--run-dir", str(run_dir), "serve",
         str(tmp / "tiny" / "model"), "--port", str(port), "--deploy-config", str(tmp / "tiny" / "deploy.yaml"),
         "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16", "--served-model-name", MODEL_NAME,
         "--stage-init-timeout", "900"], env=_env(venv), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        why = wait_healthy(url, server, 1200)
        assert why is None, f"{why}: {(tmp / 'server.log').read_text(errors='replace')[-3000:]}"
        lt = _ot(venv, "loadtest", "--base-url", url, "--run-dir", str(run_dir), "--model", MODEL_NAME,
                 "--no-html", *LOAD, timeout=900)
        client = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tests" / "support" / "vllm_omni_client.py"),
                                 url, MODEL_NAME, "8", "4", "vbs-", "openai-audio-speech"], env=_env(venv),
                                text=True, capture_output=True, timeout=600)
    finally:
        _stop(server)
        log.close()
        watcher.stop()
    out = (tmp / "server.log").read_text(errors="replace")
    assert server.returncode == 0, out[-5000:]
    assert lt.returncode == 0, lt.stdout[-3000:] + lt.stderr[-3000:]
    assert client.returncode == 0, client.stderr[-3000:]
    rep = _ot(venv, "report", str(run_dir), "--json", timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    return {"venv": venv, "run_dir": run_dir, "watcher": watcher, "output": out, "report": json.loads(rep.stdout),
            "bench": json.loads((run_dir / "bench.json").read_text()),
            "client": [json.loads(x) for x in client.stdout.splitlines() if x.startswith("{")]}


def _engine_ids(names: list[str]) -> dict[str, str]:
    """client id -> engine id (``speech-<client id>-<8 hex>``), from the segment names."""
    out = {}
    for n in names:
        m = CHUNK_KEY.match(n)
        if m and m["req"].startswith("speech-"):
            out[m["req"][len("speech-"):-9]] = m["req"]
    return out


def test_every_measured_request_attributed_across_talker_and_code2wav(served_tts) -> None:
    rep = served_tts["report"]
    w = rep["window"]
    assert (w["measured"], w["attributed"], w["failed"]) == (16, 16, 0), w
    assert rep["stages"] == {"0": "qwen3_tts", "1": "code2wav"}
    measured = {r["id"]: r for r in served_tts["bench"]["requests"] if not r["warmup"]}
    assert {r["id"] for r in rep["requests"]} == set(measured)
    for r in rep["requests"]:
        assert r["sum_error_ns"] == 0, r["id"]
        assert abs(sum(r["categories_ms"].values()) - r["ttfp_ms"]) < 1e-6 * r["ttfp_ms"] + 1e-6
        assert {h.split("#")[0] for h in r["hops"]} == {"0->1"}, r["hops"]
        assert not r["missing_spans"], (r["id"], r["missing_spans"])
        assert r["client_ttfp_ms"] >= r["ttfp_ms"], r["id"]
        # the client got whole codec frames of PCM (random weights: up to 40, fewer on an early EOS)
        assert 0 < measured[r["id"]]["bytes"] <= 40 * FRAME_BYTES and measured[r["id"]]["bytes"] % FRAME_BYTES == 0
    api_rem = sum(a["mean_ms"] for a in rep["attribution"] if a["stage"] == "api" and a["category"] == "remainder")
    assert api_rem <= 0.01 * rep["ttfp"]["server_ms"]["mean"], api_rem


def test_puts_and_gets_equal_the_segments_the_server_made(served_tts) -> None:
    """Per request: the talker's puts = the chunk segments it created in /dev/shm = those
    removed; code2wav's gets are the first of them in chunk order (fewer only where the
    producer's release task reclaimed the rest); omnitrace's chunk keys are the segment
    names. Every request of the run: the load test's and vLLM-Omni's client's."""
    watcher = served_tts["watcher"]
    created, removed = ShmWatcher.chunks(watcher.created), ShmWatcher.chunks(watcher.removed)
    engine_of = _engine_ids(watcher.created)
    ex = _ot(served_tts["venv"], "export", str(served_tts["run_dir"]), "--otlp-json",
             str(served_tts["run_dir"] / "spans.json"), timeout=300)
    assert ex.returncode == 0, ex.stderr[-2000:]
    count: Counter = Counter()
    keys, got, released = set(), {}, set()
    for line in (served_tts["run_dir"] / "spans.json").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for sp in (s for ss in rs["scopeSpans"] for s in ss["spans"]):
                a = {x["key"]: next(iter(x["value"].values())) for x in sp.get("attributes", ())}
                rid, stage = a.get("omni.request.id"), int(a.get("omni.stage.id", -1))
                if sp["name"] == "omni.chunk.put":
                    count[("put", rid)] += 1
                    keys.add((rid, stage, int(a["omni.chunk.index"])))
                elif sp["name"] == "omni.chunk.get":
                    got.setdefault(rid, []).append(int(a["omni.chunk.index"]))
                elif sp["name"] == "omni.chunk.fifo" and int(a["omni.chunk.index"]) < 0 and stage == 0:
                    released.add(rid)
    ids = {r["id"] for r in served_tts["bench"]["requests"]} | {r["id"] for r in served_tts["client"]}
    assert len(ids) == 28 and set(engine_of) == ids, sorted(set(engine_of) ^ ids)
    for rid in ids:
        eid = engine_of[rid]
        puts, gets = count[("put", rid)], sorted(got.get(rid, []))
        assert puts > 0 and puts == created[(eid, 0)] == removed[(eid, 0)], (rid, puts, created[(eid, 0)])
        assert gets == list(range(len(gets))) and 0 < len(gets) <= puts, (rid, puts, gets)
        if len(gets) < puts:
            assert rid in released, (rid, puts, gets)
    seg_keys = {(m["req"][len("speech-"):-9], int(m["stage"]), int(m["chunk"]))
                for n in watcher.created if (m := CHUNK_KEY.match(n)) and m["req"].startswith("speech-")}
    assert keys == seg_keys


def test_vllm_omni_speech_client_sees_audio_after_the_server_sent_it(served_tts, tmp_path) -> None:
    """vLLM-Omni's own ``openai-audio-speech`` client: AUDIO_TTFP >= omnitrace's server
    TTFP, request by request (joined by the id it sent)."""
    rows = served_tts["client"]
    assert len(rows) == 8 and all(r["success"] for r in rows), rows
    d, alone = served_tts["run_dir"], tmp_path / "client-only"  # the record without the load test's bench.json
    alone.mkdir()
    for n in ("run.json", "agent.json", "events"):
        (shutil.copytree if (d / n).is_dir() else shutil.copy)(d / n, alone / n)
    rep = _ot(served_tts["venv"], "report", str(alone), "--json", "--requests", "vbs-", timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    server = {r["id"]: r["ttfp_ms"] for r in json.loads(rep.stdout)["requests"]}
    assert set(server) == {r["id"] for r in rows}
    for r in rows:
        assert r["audio_ttfp_s"] * 1e3 >= server[r["id"]], r


def test_every_hook_applied_and_nothing_left_in_dev_shm(served_tts) -> None:
    """No hook skipped or raising (one `omnitrace: ` line would say so); no chunk segment,
    lock file or wake directory of the run left behind (the wake directories vLLM-Omni
    leaves are removed after the run and listed in run.json)."""
    warnings = [ln for ln in served_tts["output"].splitlines() if ln.startswith("omnitrace: ")]
    assert not warnings, warnings
    agent = json.loads((served_tts["run_dir"] / "agent.json").read_text())
    pids = {int(r["pid"]) for r in agent["rings"]}
    ids = {r["id"] for r in served_tts["bench"]["requests"]} | {r["id"] for r in served_tts["client"]}
    left = []
    for n in os.listdir("/dev/shm"):
        rid = request_of(n)
        if (n.startswith("omni_shm_wake_") and int(n.rsplit("_", 1)[1]) in pids) or (
                rid is not None and rid.removeprefix("speech-")[:-9] in ids):
            left.append(n)
    run = json.loads((served_tts["run_dir"] / "run.json").read_text())
    assert left == [], (left, run.get("shm_leftovers"))
