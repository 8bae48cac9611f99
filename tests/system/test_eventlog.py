"""The event log (omnitrace.eventlog) round trip: raw ring slots written in random cuts
decode to exactly what read_batch gives, and every segment decodes alone. The agent's
other pieces, and the event log torn, corrupt or capped: tests/unit/agent/test_pieces.py."""
from __future__ import annotations

import os
import random

from omnitrace import eventlog, record


def _fill(ring: record.Ring, twin: record.Ring, rng: random.Random, n: int) -> None:
    for i in range(n):
        q = "req-" + "\u00e9" * rng.randint(0, 60) + str(rng.randint(0, 9000))
        ring.record(3, q, 1, i, i, 2, 1000 + i)
        twin.record(3, q, 1, i, i, 2, 1000 + i)


def test_event_log_roundtrip_equals_read_batch(tmp_path):
    """Raw slots through the event log in random cuts (strings split across reads, string
    tables reset, segments rotated) decode to exactly what read_batch gives."""
    run = f"elog-{os.getpid()}"
    ring = record.Ring(run, record.ProcessInfo("stage", 0, 0, "x"), 1 << 16)
    twin = record.Ring(run + "b", record.ProcessInfo("stage", 0, 0, "x"), 1 << 16)
    raw_r, dec_r = record.RingReader(ring.name), record.RingReader(twin.name)
    w = eventlog.EventLogWriter(str(tmp_path), run, offset_ns=5, segment_raw_bytes=64 << 10)
    dec = record.SlotDecoder(record.RequestIds())
    w.ring(0, {"pid": 1, "replica": 0})
    rng = random.Random(1)
    want: list = []
    try:
        for _ in range(400):
            _fill(ring, twin, rng, rng.randint(0, 50))
            want += dec_r.read_batch()
            raw = raw_r.read_raw(rng.randint(1, 40))
            w.records(0, raw, len(dec.decode(raw)))
            w.commit({0: dec.strings}, can_rotate=not dec.cut)
        while True:
            raw = raw_r.read_raw(7)
            if not raw:
                break
            w.records(0, raw, len(dec.decode(raw)))
            w.commit({0: dec.strings}, can_rotate=not dec.cut)
        w.close({0: dec.strings})
        log = eventlog.read_event_log(str(tmp_path))
        strings = log.requests.strings
        got = [(k, strings[r], s, c, a, b, t - 5) for t, a, r, c, k, s, b, _ in log.events.tolist()]
        assert got == want and len(want) > 5000
        assert w.counters()["segments"] > 2 and w.events_recorded == len(want)
        # every segment decodes on its own (its head carries the ring and string table)
        alone_ok = 0
        for path in eventlog.segments(str(tmp_path))[1:]:
            os.makedirs(tmp_path / "alone" / "events", exist_ok=True)
            alone = tmp_path / "alone" / "events" / "seg-000000.zst"
            alone.write_bytes(open(path, "rb").read())
            one = eventlog.read_event_log(str(tmp_path / "alone"))
            assert all(one.requests.strings[r] for r in one.events["req"])
            alone_ok += len(one.events) > 0
        assert alone_ok >= 2
    finally:
        raw_r.close(unlink=True)
        dec_r.close(unlink=True)
        ring.close()
        twin.close()
