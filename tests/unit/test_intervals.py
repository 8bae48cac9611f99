"""omnitrace.intervals (the FIFO-blocking rule's arithmetic) against plain-Python loops on
random inputs: a sender's disjoint tasks (touching, zero-length, a gap-free run), waits
nested in a task, spanning several, empty, before and after all of them, of an owner that
has tasks and of one that has none."""
from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from omnitrace import intervals, keys

SEEDS = range(60)


def sender(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` disjoint tasks sorted by start (ends ascending too): boundaries drawn with
    repeats, so some tasks touch the next and some last 0 ns; owners 1..4."""
    edges = np.sort(rng.integers(0, 60, 2 * n))
    return edges[0::2].copy(), edges[1::2].copy(), rng.integers(1, 5, n).astype(np.uint32)


def waits(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` waits [q0, q1] anywhere around the tasks (some empty: q0 == q1); owners 1..5
    (5 owns no task)."""
    a, b = rng.integers(-5, 70, n), rng.integers(-5, 70, n)
    return np.minimum(a, b), np.maximum(a, b), rng.integers(1, 6, n).astype(np.uint32)


def overlap(s: int, e: int, q0: int, q1: int) -> int:
    return max(0, min(e, q1) - max(s, q0))


def ref_pieces(s, e, o, q0, q1, qo) -> list[tuple[int, int, int, int]]:
    return [(i, j, max(s[j], q0[i]), min(e[j], q1[i])) for i in range(len(q0)) for j in range(len(s))
            if o[j] != qo[i] and overlap(s[j], e[j], q0[i], q1[i]) > 0]


def ref_top(s, e, o, q0, q1, qo, k: int) -> list[tuple[int, int, int]]:
    out = []
    for i in range(len(q0)):
        by: dict[int, list[int]] = {}  # owner -> [overlap sum, first interval]
        for j in range(len(s)):
            ov = overlap(s[j], e[j], q0[i], q1[i])
            if o[j] != qo[i] and ov > 0:
                by.setdefault(int(o[j]), [0, j])[0] += ov
        ranked = sorted(by, key=lambda w: (-by[w][0], by[w][1]))[:k]
        out += [(i, w, r) for r, w in enumerate(ranked)]
    return out


def case(seed: int):
    rng = np.random.default_rng(seed)
    return (*sender(rng, int(rng.integers(0, 12))), *waits(rng, int(rng.integers(0, 10))))


def lists(*cols: np.ndarray) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in row) for row in zip(*cols)]


@pytest.mark.parametrize("seed", SEEDS)
def test_other_pieces_are_each_overlap_with_another_owner(seed):
    s, e, o, q0, q1, qo = case(seed)
    assert lists(*intervals.other_pieces(s, e, o, q0, q1, qo)) == ref_pieces(s, e, o, q0, q1, qo)


@pytest.mark.parametrize("seed", SEEDS)
def test_other_overlap_is_the_sum_of_the_pieces(seed):
    s, e, o, q0, q1, qo = case(seed)
    want = [sum(overlap(s[j], e[j], q0[i], q1[i]) for j in range(len(s)) if o[j] != qo[i])
            for i in range(len(q0))]
    assert intervals.other_overlap(s, e, o, q0, q1, qo).tolist() == want


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("top", [intervals.top_others, intervals.top_others_reference])
def test_top_others_rank_by_overlap_then_earliest_task(top, seed):
    """Both rankings (the compiled one where built): tests/unit/test_intervals_paths.py
    compares them on larger inputs."""
    s, e, o, q0, q1, qo = case(seed)
    for k in (1, 3):
        assert lists(*top(s, e, o, q0, q1, qo, k)) == ref_top(s, e, o, q0, q1, qo, k)


def test_top_others_in_batches_equal_one_batch(monkeypatch):
    s, e, o, q0, q1, qo = case(7)
    whole = lists(*intervals.top_others_reference(s, e, o, q0, q1, qo, 3))
    monkeypatch.setattr(intervals, "RANK_BATCH", 2)
    assert lists(*intervals.top_others_reference(s, e, o, q0, q1, qo, 3)) == whole


def test_a_wait_behind_others_and_its_own_task():
    """Tasks [0,10) of 2, [10,20) of 1 (the victim's own), [20,35) of 3, [35,35) of 2;
    the victim waits [5, 40]: blocked 5 + 15 by 2 and 3, never by itself."""
    s, e, o = np.array([0, 10, 20, 35]), np.array([10, 20, 35, 35]), np.array([2, 1, 3, 2], np.uint32)
    q = np.array([5]), np.array([40]), np.array([1], np.uint32)
    assert intervals.other_overlap(s, e, o, *q).tolist() == [20]
    assert lists(*intervals.other_pieces(s, e, o, *q)) == [(0, 0, 5, 10), (0, 2, 20, 35)]
    assert lists(*intervals.top_others(s, e, o, *q, 3)) == [(0, 3, 0), (0, 2, 1)]


def test_empty_inputs():
    z = np.zeros(0, np.int64)
    s, e, o, q0, q1, qo = case(3)
    assert intervals.other_overlap(z, z, z, q0, q1, qo).tolist() == [0] * len(q0)
    assert intervals.other_overlap(s, e, o, z, z, z).tolist() == []
    assert all(len(c) == 0 for c in intervals.other_pieces(z, z, z, q0, q1, qo))
    assert all(len(c) == 0 for c in intervals.top_others(s, e, o, z, z, z, 3))
    assert all(len(c) == 0 for c in intervals.top_others_reference(s, e, o, z, z, z, 3))


def ref_union(group, owner, start, end) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
    """Per group, the length of the union; per (group, owner), its share: each elementary
    segment split evenly among the owners with an interval over it."""
    wall: dict[int, float] = {}
    share: dict[tuple[int, int], float] = {}
    for g in set(group.tolist()):
        mine = [(int(o), int(a), int(b)) for gg, o, a, b in zip(group, owner, start, end) if gg == g]
        cuts = sorted({t for _, a, b in mine for t in (a, b)})
        for a, b in pairwise(cuts):
            active = {o for o, s, e in mine if s <= a and b <= e}
            if active:
                wall[g] = wall.get(g, 0.0) + (b - a)
                for o in active:
                    share[(g, o)] = share.get((g, o), 0.0) + (b - a) / len(active)
    return wall, share


@pytest.mark.parametrize("seed", SEEDS)
def test_union_shares_split_each_moment_among_the_owners_then(seed):
    """Nested, touching and repeated intervals of one owner count once; n owners at once
    share a moment evenly; a group's shares add up to its union."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 25))
    a, b = rng.integers(0, 40, n), rng.integers(1, 12, n)
    group, owner = rng.integers(0, 3, n), rng.integers(1, 4, n)
    wall, m_group, m_owner, shares = intervals.union_shares(group, owner, a, a + b)
    want_wall, want_share = ref_union(group, owner, a, a + b)
    assert wall.tolist() == [want_wall.get(g, 0.0) for g in range(int(group.max()) + 1)]
    got: dict[tuple[int, int], float] = {}
    for k, v in zip(zip(m_group.tolist(), m_owner.tolist()), shares.tolist()):
        got[k] = got.get(k, 0.0) + v
    assert got.keys() == want_share.keys()
    assert all(got[k] == pytest.approx(want_share[k]) for k in got)


def test_expand_ranges():
    owner, index = intervals.expand_ranges(np.array([2, 5, 0, 3]), np.array([4, 5, 1, 2]))
    assert lists(owner, index) == [(0, 2), (0, 3), (2, 0)]


def test_sender_key_groups_rows_by_sender():
    where, stage = np.array([7, -1, 7, 3, 7]), np.array([1, 0, 2, 1, 1])
    got = [(keys.sender_of(k), rows.tolist()) for k, rows in keys.groups(keys.sender_key(where, stage))]
    assert got == [((-1, 0), [1]), ((3, 1), [3]), ((7, 1), [0, 4]), ((7, 2), [2])]
    assert list(keys.groups(np.zeros(0, np.int64))) == []
