"""The two ring writers (record.Ring, the Python reference, and its compiled twin
omnitrace/_ringc.c) write the same bytes for the same calls: records, interned request
ids (the id table's reset included), wrap-around, full-ring drops and their counters."""
from __future__ import annotations

import os
import random
import struct
import time

import pytest

from omnitrace import record
from omnitrace.conventions import Ev

pytestmark = pytest.mark.skipif(record._ringc is None, reason="built without a C compiler")

INFO = record.ProcessInfo("stage", 1, 0, "paths")


@pytest.fixture
def pair():
    run = f"paths-{os.getpid()}"
    made = []

    def make(capacity: int):
        py = record.Ring(run + f"p{len(made)}", INFO, capacity)
        c = record.Ring(run + f"c{len(made)}", INFO, capacity)
        made.extend([py, c])
        return py, c, c.writer()
    yield make
    for ring in made:
        ring.close()
        os.unlink(os.path.join(record.SHM_DIR, ring.name))


def body(ring: record.Ring) -> bytes:
    """The ring's records and the header's counters (write, read, dropped, string slots);
    the rest of the header (clock anchors, tid) is per ring by design."""
    buf = ring.buf
    return bytes(buf[24:48]) + bytes(buf[88:96]) + bytes(buf[record.HEADER_SIZE:])


def advance_reader(ring: record.Ring, to: int) -> None:
    struct.pack_into("<Q", ring.buf, record.OFF_READ, to)


def test_the_same_calls_write_the_same_bytes(pair, monkeypatch):
    monkeypatch.setattr(record, "MAX_INTERNED", 64)  # the id table resets often
    py, c, writer = pair(256)
    rng = random.Random(7)
    for i in range(20_000):
        req = "req-" + "\u00e9" * rng.randint(0, 40) + str(rng.randint(0, 200))
        args = (rng.choice([Ev.FIFO_ENQUEUE, Ev.PUT_END]), req, rng.randint(-1, 3), rng.randint(-1, 9),
                rng.randint(-2**63, 2**63 - 1), rng.randint(-2**31, 2**31 - 1), rng.randint(1, 2**62))
        py.record(*args)
        writer.record(*args)
        if rng.random() < 0.05:  # the agent reads some of it: the ring wraps, and drops when full
            to = int.from_bytes(py.buf[24:32], "little") - rng.randint(0, 40)
            for ring in (py, c):
                advance_reader(ring, max(to, int.from_bytes(ring.buf[32:40], "little")))
    state = writer.state()
    assert body(py) == body(c)
    assert state["dropped"] == py._dropped > 0 and state["string_slots"] == py._string_slots > 0
    assert state["w"] == py._w > 256 and state["ids"] == py._ids


def test_keywords_defaults_and_its_own_clock(pair):
    py, c, writer = pair(64)
    py.record(Ev.SNAPSHOT_BEGIN, "r", 2, t=5)
    writer.record(kind=Ev.SNAPSHOT_BEGIN, req="r", stage=2, t=5)
    assert body(py) == body(c)
    before = time.perf_counter_ns()
    writer.record(Ev.SNAPSHOT_END, "r", 2)
    after = time.perf_counter_ns()
    reader = record.RingReader(c.name)
    try:
        stamps = [e[6] for e in reader.read_batch()]
    finally:
        reader.close()
    assert before <= stamps[-1] <= after  # time.perf_counter_ns's clock


def test_bad_calls_raise_and_write_nothing(pair):
    py, c, writer = pair(64)
    for args in [(70_000, "r", 0), (1, "r", 40_000), (1, "r", 0, 2**31), (1, 7, 0)]:
        with pytest.raises((OverflowError, TypeError, struct.error, AttributeError)):
            py.record(*args)
        with pytest.raises((OverflowError, TypeError)):
            writer.record(*args)
    with pytest.raises(TypeError):
        writer.record(1, "r")
    with pytest.raises(TypeError):
        writer.record(1, "r", 0, nonsense=1)
    assert writer.state()["w"] == 0


def test_thread_ring_uses_the_compiled_writer_unless_told(monkeypatch):
    monkeypatch.setenv("OMNITRACE_RUN_ID", f"paths-tr-{os.getpid()}")
    for setting, kind in ((None, record._ringc.Writer), ("python", record.Ring)):
        if setting:
            monkeypatch.setenv("OMNITRACE_RECORD_WRITER", setting)
        record._after_fork_in_child()  # a fresh thread-ring table
        ring = record.thread_ring()
        try:
            assert isinstance(ring, kind)
        finally:
            for owner in record._rings:
                owner.close()
                os.unlink(os.path.join(record.SHM_DIR, owner.name))
            record._after_fork_in_child()
