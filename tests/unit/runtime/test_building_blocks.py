"""Runtime building blocks on their own: config validation, snapshots, the shm connector,
the chunking rules, the FIFO + sender + receiver threads (real threads, real shm)."""
from __future__ import annotations

import copy
import os
import threading

import numpy as np
import pytest
import yaml

from omnitrace.runtime import config, snapshot
from omnitrace.runtime.config import PipelineConfigError
from omnitrace.runtime.shm import HDR_SIZE, ChunkMeta, Segment, ShmConnector, chunk_key, exists
from omnitrace.runtime.transfer import (CHUNK, CodecProcessor, Fifo, HiddenProcessor, Receiver, Sender,
                                        Task, codec_boundary)
from tests.support.sources import ROOT


TAG = f"rtu{os.getpid()}"


def default_dict() -> dict:
    with open(config.DEFAULT_PIPELINE) as f:
        return yaml.safe_load(f)


# --------------------------------------------------------------------------- config
def test_default_pipeline_is_qwen3_omni_shape():
    cfg = config.load()
    assert [(s.name, s.kind, s.inputs, s.produces, s.emits) for s in cfg.stages] == [
        ("thinker", "ar", None, "hidden", "text"),
        ("talker", "ar", "thinker", "codec", "none"),
        ("code2wav", "generation", "talker", "none", "audio")]
    ch = cfg.stages[1].chunk
    assert (ch.initial_codec_chunk_frames, ch.codec_chunk_frames, ch.codec_left_context_frames,
            ch.bytes_per_frame) == (4, 25, 25, 128)
    assert cfg.stages[0].chunk.prefill_bytes_per_token == 8192 and cfg.stages[0].chunk.decode_bytes == 4096
    assert (cfg.audio.sample_rate, cfg.audio.samples_per_frame) == (24000, 480)
    assert config.from_dict(config.to_dict(cfg)).stages == cfg.stages
def test_example_is_the_packaged_default():
    with open(os.path.join(ROOT, "examples", "qwen3_omni.yaml")) as f:
        example = f.read()
    with open(config.DEFAULT_PIPELINE) as f:
        assert example == f.read(), "examples/qwen3_omni.yaml must stay a copy of the packaged default"
@pytest.mark.parametrize("edit,message", [
    (lambda d: d["stages"][1].update(max_batch_size=0),
     "stages[1].max_batch_size: must be a positive integer, got 0"),
    (lambda d: d["stages"][0].update(max_waiting="many"),
     "stages[0].max_waiting: must be a positive integer, got 'many'"),
    (lambda d: d["stages"][2].update(kind="diffusion"),
     "stages[2].kind: must be one of ar, generation, got 'diffusion'"),
    (lambda d: d["stages"][1].update(inputs="code2wav"),
     "stages[1].inputs: must name the previous stage 'thinker', got 'code2wav'"),
    (lambda d: d["stages"][0]["cost"].update(base_ms=-1),
     "stages[0].cost.base_ms: must be a non-negative number, got -1"),
    (lambda d: d["stages"][1]["chunk"].update(codec_chunk_frames=0),
     "stages[1].chunk.codec_chunk_frames: must be a positive integer, got 0"),
    (lambda d: d["stages"][1].update(max_batch=3), "stages[1].max_batch: unknown field"),
    (lambda d: d["stages"][2].update(kind="ar"), "stages[2].kind: a consumer of codec chunks must be generation"),
    (lambda d: d["stages"][1].update(name="thinker"), "stages[1].name: duplicate stage name 'thinker'"),
    (lambda d: d.update(stages=[]), "stages: must be a non-empty list"),
    (lambda d: d["limits"].update(max_tokens=0), "limits.max_tokens: must be a positive integer, got 0"),
    (lambda d: d["stages"][0].update(compute="gpu"), "stages[0].compute: must be one of emulated, torch"),
])
def test_invalid_config_names_the_field(edit, message):
    d = default_dict()
    edit(d)
    with pytest.raises(PipelineConfigError) as e:
        config.from_dict(d)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [\n  - name: x\n   kind")
    with pytest.raises(PipelineConfigError, match=r"invalid YAML at line \d+"):
        config.load(str(bad))
    with pytest.raises(PipelineConfigError, match="cannot read pipeline config"):
        config.load(str(tmp_path / "missing.yaml"))
def test_two_stage_pipeline_is_valid():
    d = default_dict()
    d["stages"] = d["stages"][:1]
    d["stages"][0]["produces"] = "none"
    assert len(config.from_dict(d).stages) == 1


# --------------------------------------------------------------------------- snapshot
@pytest.mark.parametrize("strategy", snapshot.STRATEGIES)
def test_snapshot_is_independent_of_the_live_request(strategy):
    fn, _ = snapshot.get(strategy)
    req = snapshot.Request("r", list(range(2500)), {"upstream_chunks": [1, 2], "speaker": "x"})
    req.output_token_ids.extend([5, 6])
    snap = fn(req)
    assert snap.prompt_token_ids == req.prompt_token_ids and snap.prompt_token_ids is not req.prompt_token_ids
    req.output_token_ids.append(7)
    req.additional_information["upstream_chunks"].append(3)
    assert snap.output_token_ids == [5, 6] and snap.additional_information["upstream_chunks"] == [1, 2]
    with pytest.raises(ValueError, match="--snapshot"):
        snapshot.get("deep")


# --------------------------------------------------------------------------- shm connector
@pytest.mark.parametrize("mode", ["per-chunk", "pool"])
def test_connector_round_trip_and_cleanup(mode):
    prod, cons = ShmConnector(0, mode, f"{TAG}pool"), ShmConnector(1, mode, f"{TAG}x")
    rid = f"{TAG}-{mode}"
    try:
        for i, n in enumerate([3, 300_000, 7, 2_000_000]):
            key = chunk_key(rid, 0, i)
            assert cons.get(key) is None  # a miss before the put
            data = (np.arange(n, dtype=np.int64) % 1000).reshape(-1, 1)
            assert prod.put(rid, key, ChunkMeta(i, i == 3, n, 1), data) == data.nbytes
            meta, got, nbytes = cons.get(key)
            assert (meta.chunk, meta.finished, meta.n_new, meta.n_context) == (i, i == 3, n, 1)
            assert nbytes == data.nbytes and np.array_equal(got, data)
            del got
            cons.release(key)
            assert not exists(key)  # the reader unlinks
        # a chunk nobody reads is unlinked by the producer's cleanup (abort)
        prod.put(rid, chunk_key(rid, 0, 9), ChunkMeta(9), np.zeros(10))
        prod.put(rid, chunk_key(rid, 0, 10), ChunkMeta(10, True), None)
        assert exists(chunk_key(rid, 0, 9))
        assert prod.discard_request(rid) == 2
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(rid)]
    finally:
        prod.close()
        cons.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"{TAG}pool")]
def test_pool_reuses_slots_per_size_class_and_falls_back_past_its_budget():
    prod, cons = ShmConnector(0, "pool", f"{TAG}grow", pool_max_bytes=4 << 20), ShmConnector(1, "pool", "")
    rid = f"{TAG}-grow"

    def slots() -> list[str]:
        return [n for n in os.listdir("/dev/shm") if n.startswith(f"{TAG}grow")]
    try:
        for i, n in enumerate([1000, 1000, 3 << 20, 1000, 3 << 20]):
            key = chunk_key(rid, 0, i)
            prod.put(rid, key, ChunkMeta(i), np.ones(n, np.uint8))
            _, got, _ = cons.get(key)
            assert got.sum() == n
            del got
            cons.release(key)
        assert len(slots()) == 2  # one 8 KiB slot and one 3 MiB slot, each reused
        # a leased slot is not reused: a second chunk in flight takes another slot
        prod.put(rid, chunk_key(rid, 0, 10), ChunkMeta(10), np.ones(10, np.uint8))
        _, held, _ = cons.get(chunk_key(rid, 0, 10))
        prod.put(rid, chunk_key(rid, 0, 11), ChunkMeta(11), np.full(10, 2, np.uint8))
        assert len(slots()) == 3 and held.sum() == 10  # the held view is intact
        # past the budget (4 MiB here) a chunk goes to its own segment and still arrives
        prod.put(rid, chunk_key(rid, 0, 12), ChunkMeta(12), np.full(2 << 20, 3, np.uint8))
        assert len(slots()) == 3
        _, got, n = cons.get(chunk_key(rid, 0, 12))
        assert n == 2 << 20 and int(got[-1]) == 3
        del got, held
    finally:
        prod.close()
        cons.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"{TAG}grow") or n.startswith(rid)]
def test_half_written_segment_is_a_miss():
    key = f"{TAG}-half_0_0"
    seg = Segment.create(key, HDR_SIZE + 16)  # created, header magic not yet written
    try:
        cons = ShmConnector(1)
        assert cons.get(key) is None and exists(key)
    finally:
        seg.close()
        os.unlink(f"/dev/shm/{key}")


# --------------------------------------------------------------------------- chunking rules
def test_codec_chunk_boundaries():
    ch = config.ChunkConfig()
    sent, chunks = 0, []
    for n in range(1, 121):
        if codec_boundary(n, sent, n == 120, ch):
            chunks.append(n)
            sent = n
    assert chunks == [4, 29, 54, 79, 104, 120]
def test_processors_payload_sizes():
    ch = config.ChunkConfig()
    hp = HiddenProcessor(ch)
    req = snapshot.Request("h", list(range(2500)))
    req.output_token_ids.append(1)
    meta, data = hp.process(Task(CHUNK, "h", 0, copy.copy(req)))
    assert data.nbytes == 2500 * 8192 == 20_480_000 and meta.chunk == 0 and meta.n_new == 2500
    meta, data = hp.process(Task(CHUNK, "h", 1, copy.copy(req)))
    assert data.nbytes == 4096 and meta.chunk == 1
    cp = CodecProcessor(ch)
    sizes = []
    talker = snapshot.Request("c", [0] * 10)
    for i in range(60):
        talker.output_token_ids.append(i)
        out = cp.process(Task(CHUNK, "c", 0, snapshot.snapshot_copy(talker), i == 59))
        if out is not None:
            meta, data = out
            sizes.append((meta.chunk, meta.n_new, meta.n_context, data.nbytes))
    # 4 frames; then 25 new + 4 context (~3.8 KB); then 25 + 25 context (6.4 KB); terminal 6 + 25
    assert sizes == [(0, 4, 0, 512), (1, 25, 4, 29 * 128), (2, 25, 25, 50 * 128), (3, 6, 25, 31 * 128)]


# --------------------------------------------------------------------------- threads
@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["per-chunk", "pool"])
def test_fifo_sender_receiver_deliver_in_order(mode):
    """Two requests interleaved in the one FIFO arrive complete and in order per request."""
    prod, cons = ShmConnector(0, mode, f"{TAG}thr"), ShmConnector(1, mode, "")
    fifo = Fifo()
    sender = Sender(fifo, prod, HiddenProcessor(config.ChunkConfig()), 0, 1)
    got: dict[str, list[int]] = {}
    done = threading.Event()
    rids = [f"{TAG}-t{mode}-a", f"{TAG}-t{mode}-b"]

    def on_ready(rid, meta, data, chunk):
        got.setdefault(rid, []).append(chunk)
        cons.release(chunk_key(rid, 0, chunk))
        if not meta.finished:
            receiver.load(rid, chunk + 1)
        if sum(len(v) for v in got.values()) == 20:
            done.set()

    receiver = Receiver(cons, 1, 0, on_ready)
    sender.start()
    receiver.start()
    try:
        reqs = {r: snapshot.Request(r, list(range(50))) for r in rids}
        for r in rids:
            receiver.load(r, 0)
        from omnitrace.record import NULL_RING
        for step in range(10):
            for r in rids:
                reqs[r].output_token_ids.append(step)
                fifo.enqueue(NULL_RING, Task(CHUNK, r, step, snapshot.snapshot_copy(reqs[r]), step == 9), 0, 1)
        assert done.wait(20)
        assert got == {r: list(range(10)) for r in rids}
        assert fifo.tasks == type(fifo.tasks)() and sender.error is None and receiver.error is None
    finally:
        fifo.stop()
        receiver.stop()
        sender.join(5)
        receiver.join(5)
        prod.close()
        cons.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"{TAG}-t") or n.startswith(f"{TAG}thr")]
