"""Head-of-line blocking's arithmetic (omnitrace.rules.headofline, omnitrace.intervals): two
senders blocking at once split evenly, and the vectorised rule equals the per-victim
reference loop (tests/support/hol_reference.py) on random schedules. On a hand-built run,
through `omnitrace report`: tests/system/report/test_report_hol.py."""
from __future__ import annotations

import numpy as np
import pytest

from omnitrace import intervals
from omnitrace import spantable as stt
from omnitrace.rules import headofline
from tests.support import hol_reference


def test_two_senders_blocked_at_once_split_evenly():
    pieces = [(0, 10, 1), (5, 15, 2), (5, 10, 1)]
    assert hol_reference._union_split(pieces) == (15, {1: 7.5, 2: 7.5})
    vi = np.zeros(3, np.int64)
    start, end, culprit = (np.array(x, np.int64) for x in zip(*pieces))
    wall, _, owners, shares = intervals.union_shares(vi, culprit, start, end)
    assert wall.tolist() == [15.0]
    got: dict[int, float] = {}
    for k, v in zip(owners.tolist(), shares.tolist()):
        got[k] = got.get(k, 0.0) + v
    assert got == {1: 7.5, 2: 7.5}


def _random_schedule(rng: np.random.Generator, n_req: int = 40, chunks: int = 8):
    """Two hops (0->1, 1->2), two replicas per sender, FIFO waits and sender tasks drawn at
    random: overlapping waits, ties, a culprit with several tasks, victims' own tasks."""
    rows, busy = [], {}
    for prod in (0, 1):
        for replica in (0, 1):
            t, starts, ends, reqs = 0, [], [], []
            for _ in range(300):
                t += int(rng.integers(0, 30))  # 0: a task starting where the last ended
                d = int(rng.integers(1, 60))
                starts.append(t), ends.append(t + d), reqs.append(int(rng.integers(1, n_req + 1)))
                t += d
            busy[(prod, replica)] = (np.array(starts, np.int64), np.array(ends, np.int64),
                                     np.array(reqs, np.uint32))
    for req in range(1, n_req + 1):
        for prod in (0, 1):
            replica = int(rng.integers(0, 2))
            for c in range(chunks):
                s = int(rng.integers(0, 9000))
                rows.append((stt.N_FIFO, prod, prod + 1, replica, req, c, s, s + int(rng.integers(1, 800))))
    table = np.zeros(len(rows), stt.CHUNK_DTYPE)
    for i, col in enumerate(("name", "stage", "peer", "replica", "req", "chunk", "start", "end")):
        table[col] = [r[i] for r in rows]
    victims = []
    for req in rng.choice(np.arange(1, n_req + 1), n_req // 2, replace=False).tolist():
        a = int(rng.integers(0, 3000))
        victims.append(headofline.Victim(req, a, a + int(rng.integers(100, 7000)),
                                         [(0, 1, int(rng.integers(0, chunks))),
                                          (1, 2, int(rng.integers(0, chunks)))]))
    return victims, table, busy


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_equals_the_reference_loop(seed, monkeypatch):
    victims, table, busy = _random_schedule(np.random.default_rng(seed))
    if seed % 2:  # victims in batches (bounded memory) give the same figures
        monkeypatch.setattr(headofline, "VICTIM_BATCH", 3)
    fast = hol_reference.as_blocked(victims, table, busy)
    ref = hol_reference.blocked(victims, table, busy)
    assert [b.req for b in fast] == [b.req for b in ref]
    assert sum(b.wall_ns > 0 for b in ref) >= len(victims) // 2  # the schedule does block
    for f, r in zip(fast, ref):
        assert f.chunk_ns == r.chunk_ns
        assert f.wall_ns == pytest.approx(r.wall_ns, abs=1e-6)
        assert set(f.by_culprit) == set(r.by_culprit)
        for c, (wall, chunk_ns, tasks) in r.by_culprit.items():
            assert f.by_culprit[c][1:] == [chunk_ns, tasks]
            assert f.by_culprit[c][0] == pytest.approx(wall, abs=1e-6)
