"""The compiled feed preparation and record copy (omnitrace/_decodec.c) give the same rows
in the same order as their numpy references (spantable.group_reference,
spantable.of_kinds_reference, eventlog.events_of_reference) on random inputs of many shapes:
empty and one-row inputs, unknown kinds (past 255 too), events without a request, ties,
fields that leave the packing's ranges (negative chunks and stages, huge request ids, ``b``
over 2^24) and offsets that wrap. And where the module is
built, Prepared and the decoder use it."""
from __future__ import annotations

import importlib.machinery
from pathlib import Path

import numpy as np
import pytest

from omnitrace import eventlog, record
from omnitrace import spantable as stt
from omnitrace.eventlog import EVENT_DTYPE

built = pytest.mark.skipif(stt._decodec is None, reason="built without a C compiler")


def events(seed: int) -> np.ndarray:
    """Random event rows: a feed's worth of few kinds, requests and chunks, or rows of any
    values at all."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 2, 7, 300, 5000]))
    ev = np.zeros(n, EVENT_DTYPE)
    wild = seed % 4 == 3
    ev["t"] = rng.integers(-(1 << 62), 1 << 62, n) if wild else np.sort(rng.integers(0, 1000, n))
    ev["a"] = rng.integers(-5, 5, n)
    ev["req"] = rng.integers(0, 1 << 32, n, dtype=np.uint64) if wild else rng.integers(0, 12, n)
    ev["chunk"] = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int64) if wild else rng.integers(-2, 40, n)
    known = np.flatnonzero(stt._KNOWN)
    kinds = rng.integers(0, 1 << 16, n) if wild else rng.choice(np.append(known, [0, 200, 255, 256, 999]), n)
    ev["kind"] = kinds
    ev["stage"] = rng.integers(-(1 << 15), 1 << 15, n) if wild else rng.integers(-1, 6, n)
    ev["b"] = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int64) if wild else rng.integers(-1, 6, n)
    ev["ring"] = rng.integers(-(1 << 31), 1 << 31, n) if wild else rng.integers(0, 9, n)
    if seed % 5 == 0:  # already in key order: the compiled sort's shortcut
        ev = ev[np.argsort(stt._key(ev["req"], ev["stage"], ev["chunk"]), kind="stable")]
    return ev


def same_rows(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and len(a) == len(b)
    assert a.tobytes() == b.tobytes()


@built
@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("chunks", [True, False])
@pytest.mark.parametrize("rings", [0, 1, 4, 9])
def test_compiled_group_is_the_reference(seed, chunks, rings):
    ev = events(seed)
    if rings:  # rings counted: a few past those described, and none (a negative index)
        ev["ring"] = np.where(ev["ring"] < 0, -1, ev["ring"] % 12)
    rows, pos, starts, *counts, kinds = stt._group(ev, chunks, rings)
    ref_rows, ref_pos, ref_starts, *ref_counts, ref_kinds = stt.group_reference(ev, chunks, rings)
    same_rows(rows, ref_rows)
    assert pos.tolist() == ref_pos.tolist()
    assert starts.tolist() == ref_starts.tolist()
    assert counts == ref_counts  # unknown, steps, max ring
    if rings:  # events per ring and kind, of every ring (more than those described: counted again)
        assert kinds.shape == ref_kinds.shape == (max(rings, counts[2] + 1), 256)
        assert kinds.tolist() == ref_kinds.tolist()
    else:
        assert kinds is None and ref_kinds is None


@built
@pytest.mark.parametrize("seed", range(30))
def test_compiled_of_kinds_is_the_reference(seed):
    ev = events(seed)
    kinds = np.random.default_rng(seed).random(256) < 0.2
    kinds[255] = False
    same_rows(stt.of_kinds(ev, kinds), stt.of_kinds_reference(ev, kinds))
    same_rows(stt.of_kinds(ev[::3], kinds), stt.of_kinds_reference(ev[::3], kinds))  # strided


def test_ring_kinds_reference_counts_each_event_once():
    ev = np.zeros(6, EVENT_DTYPE)
    ev["ring"] = [0, 0, 2, 5, -1, 1]
    ev["kind"] = [3, 3, 7, 9, 3, 300]  # ring 5 not asked for; ring -1 none; kind 300 past the table
    counts = stt.ring_kinds_reference(ev, 3)
    assert counts.shape == (3, 256) and counts.sum() == 3
    assert counts[0, 3] == 2 and counts[2, 7] == 1


@built
@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("known", [False, True])
def test_compiled_requests_are_the_reference(seed, known):
    ev = events(seed)
    if seed % 3 == 1:  # one far request beside the rest: the wide range's reference
        ev["req"][:1] += 1 << 21
    reqs, (ids, latest) = stt._requests(ev, known)
    ref_reqs, (ref_ids, ref_latest) = stt.requests_reference(ev, known)
    assert reqs == ref_reqs
    assert ids.dtype == ref_ids.dtype and ids.tolist() == ref_ids.tolist()
    assert latest.dtype == ref_latest.dtype and latest.tolist() == ref_latest.tolist()


@built
@pytest.mark.parametrize("seed", range(20))
def test_compiled_events_of_is_the_reference(seed):
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(int(rng.integers(0, 4))):
        raw = rng.integers(0, 256, int(rng.choice([0, 1, 50])) * record.RECORD_SIZE, dtype=np.uint8)
        parts.append((raw.view(record.RECORD_DTYPE), int(rng.integers(0, 1 << 31))))
    for offset in (0, 17, -(1 << 40), (1 << 63) - 1):
        same_rows(eventlog._events_of(parts, offset), eventlog.events_of_reference(parts, offset))


@built
def test_compiled_refuses_bad_buffers():
    c = stt._decodec
    ev = np.zeros(3, EVENT_DTYPE)
    with pytest.raises(ValueError):  # not 36-byte rows
        c.of_kinds(np.zeros(5, np.uint8), b"\0" * 256, np.empty(2, EVENT_DTYPE))
    with pytest.raises(ValueError):  # kind 255 known
        c.group(ev, b"\1" * 256, np.empty(3, EVENT_DTYPE), np.empty(3, np.int64), np.empty(257, np.int64))
    with pytest.raises(ValueError):  # kind 255 kept
        c.group(ev, stt._KNOWN_BYTES, np.empty(3, EVENT_DTYPE), np.empty(3, np.int64), np.empty(257, np.int64),
                b"\1" * 256)
    with pytest.raises(ValueError):  # kind 255 taken
        c.of_kinds(ev, b"\1" * 256, np.empty(3, EVENT_DTYPE))
    with pytest.raises(ValueError):  # out too small
        c.of_kinds(ev, b"\0" * 256, np.empty(2, EVENT_DTYPE))
    with pytest.raises(ValueError):  # counts not 256 per ring
        c.group(ev, stt._KNOWN_BYTES, np.empty(3, EVENT_DTYPE), np.empty(3, np.int64), np.empty(257, np.int64),
                stt._KNOWN_BYTES, np.zeros(255, np.int64))
    with pytest.raises(ValueError):  # tops and seen of two sizes
        c.latest(ev, np.empty(2, np.int64), np.empty(3, np.uint8))
    with pytest.raises(ValueError):  # 255 known
        c.latest(ev, np.empty(3, np.int64), np.empty(3, np.uint8), b"\1" * 256)
    with pytest.raises(ValueError):
        c.events_of(np.zeros(33, np.uint8), np.empty(2, EVENT_DTYPE), 0, 0)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("chunks", [True, False])
def test_prepared_without_the_compiled_steps_is_the_same(monkeypatch, seed, chunks):
    """Prepared made with the references alone holds the same arrays."""
    ev = events(seed)
    ev["t"] = np.sort(ev["t"])
    compiled = stt.Prepared(ev, chunks)
    monkeypatch.setattr(stt, "_decodec", None)
    ref = stt.Prepared(ev, chunks)
    monkeypatch.undo()
    for name in ("emitted", "small", "senders", "gets"):
        same_rows(getattr(compiled, name), getattr(ref, name))
    for (b, e), (rb, re_) in zip(compiled.pairs, ref.pairs):
        same_rows(b, rb)
        same_rows(e, re_)
    assert compiled.reqs == ref.reqs
    assert [a.tolist() for a in compiled.latest] == [a.tolist() for a in ref.latest]
    assert (compiled.unknown, compiled.steps, compiled.events, compiled.max_ring) == (
        ref.unknown, ref.steps, ref.events, ref.max_ring)


def test_a_built_decodec_imports():
    """The compiled steps are missing only where nothing was compiled: an extension file
    that fails to import, or the ring writer built without it, is a broken build, mended
    by `pip install -e .` or `python setup.py build_ext --inplace`."""
    here = Path(stt.__file__).parent
    files = [p for suffix in importlib.machinery.EXTENSION_SUFFIXES for p in here.glob("_decodec" + suffix)]
    if files or record._ringc is not None:
        assert stt._decodec is not None and eventlog._decodec is not None, files


def slot_stream(rng: np.random.Generator) -> bytes:
    """Ring slots as a writer leaves them: STRING records (ids growing, resets to 1, texts
    whose bytes look like STRING records) among event records of defined, undefined and
    out-of-table request ids."""
    out, rid = [], 0
    for _ in range(int(rng.integers(0, 400))):
        if rng.random() < 0.2:
            rid = 1 if rng.random() < 0.1 else rid + 1
            text = bytes(rng.choice([1, 0, 97, 98, 0xC3], int(rng.integers(0, 90))).astype(np.uint8))
            slots = (len(text) + record.RECORD_SIZE - 1) // record.RECORD_SIZE
            if rng.random() < 0.05:  # corrupt: a negative length, no bytes
                text, slots = b"", 0
                length = int(rng.integers(-80, 0))
            else:
                length = len(text)
            out.append(record.RECORD.pack(0, length, rid, 0, record._STRING_KIND, 0, 0)
                       + text.ljust(slots * record.RECORD_SIZE, b"\0"))
        else:
            req = int(rng.choice([0, rid, max(rid - 1, 0), 5000, (1 << 32) - 1]))
            out.append(record.RECORD.pack(int(rng.integers(0, 1 << 40)), int(rng.integers(-9, 9)), req,
                                          int(rng.integers(-2, 9)), int(rng.integers(2, 70)), 1, 2))
    return b"".join(out)


@built
@pytest.mark.parametrize("seed", range(40))
def test_compiled_decoder_is_the_reference(seed, monkeypatch):
    """The decoder with its compiled steps (keep_runs, map_req) and without: the same
    records and tables, for the same slots cut anywhere between slots."""
    rng = np.random.default_rng(seed)
    raw = slot_stream(rng)
    n = len(raw) // record.RECORD_SIZE
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 6)))) * record.RECORD_SIZE
    pieces = [raw[a:b] for a, b in zip((0, *cuts), (*cuts, len(raw)))]

    def decoded() -> tuple[bytes, list[str], dict]:
        dec = record.SlotDecoder(record.RequestIds())
        got = b"".join(dec.decode(p).tobytes() for p in pieces)
        return got, dec.requests.strings, dict(dec.strings)

    compiled = decoded()
    monkeypatch.setattr(record, "_decodec", None)
    assert compiled == decoded()


@built
@pytest.mark.parametrize("seed", range(20))
def test_compiled_record_steps_are_the_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 9, 500]))
    rec = rng.integers(0, 256, n * record.RECORD_SIZE, dtype=np.uint8).view(record.RECORD_DTYPE)
    edges = np.sort(rng.choice(n + 1, min(n + 1, 2 * int(rng.integers(0, 6))), replace=False))
    drops = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]
    same_rows(record.keep_runs(rec, drops), record.keep_runs_reference(rec, drops))
    lut = rng.integers(0, 1 << 32, int(rng.integers(1, 300)), dtype=np.uint64).astype(np.uint32)
    rec["req"] = rng.integers(0, 400, n)
    lo = int(rng.integers(0, n + 1))
    hi = int(rng.integers(lo, n + 1))
    a, b = rec.copy(), rec.copy()
    record.map_ids(a, lo, hi, lut)
    record.map_ids_reference(b, lo, hi, lut)
    same_rows(a, b)


def sender_seq(seed: int) -> np.ndarray:
    """One sender's events in time order: dequeues, PROCESS_ENDs (some of 0 bytes), PUT_ENDs
    and others, of few requests and chunks; many at one instant (batches), times negative
    too (the rule's start is then at least 0 within a batched sequence)."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 2, 5, 40, 400]))
    ev = np.zeros(n, EVENT_DTYPE)
    ev["t"] = np.sort(rng.integers(-3 if seed % 3 == 0 else 0, int(rng.choice([3, 50, 10 ** 6])), n))
    E = stt.E
    ev["kind"] = rng.choice([E.FIFO_DEQUEUE, E.FIFO_DEQUEUE, E.PROCESS_END, E.PUT_END, E.FIFO_ENQUEUE], n)
    ev["req"] = rng.integers(1, 4, n)
    ev["chunk"] = rng.integers(-1, 3, n)
    ev["a"] = rng.choice([0, 0, 7], n)
    return ev


@built
@pytest.mark.parametrize("seed", range(300))
def test_compiled_sender_rule_is_the_reference(seed):
    seq = sender_seq(seed)
    got, want = stt.sender_tasks(seq), stt.sender_tasks_reference(seq)
    for a, b in zip(got[:3], want[:3]):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()
    assert got[3] == want[3]


@pytest.mark.parametrize("seed", range(20))
def test_prepared_without_chunks_holds_the_same_request_side(seed):
    """A feed made ready for request spans only (its chunk stamps never copied) gives the
    builder the same request and stage events, the same requests with the same latest
    times (taken over the chunk stamps too: where an incomplete request ends) and counts."""
    ev = events(seed)
    ev["t"] = np.sort(ev["t"])
    whole, unchunked = stt.Prepared(ev, True), stt.Prepared(ev, False)
    for name in ("emitted", "small"):
        same_rows(getattr(unchunked, name), getattr(whole, name))
    assert unchunked.reqs == whole.reqs
    assert [a.tolist() for a in unchunked.latest] == [a.tolist() for a in whole.latest]
    assert (unchunked.unknown, unchunked.steps, unchunked.events, unchunked.max_ring) == (
        whole.unknown, whole.steps, whole.events, whole.max_ring)
    assert not len(unchunked.senders) and not len(unchunked.gets)
