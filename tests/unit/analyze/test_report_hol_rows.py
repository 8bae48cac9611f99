"""The report's head-of-line rows (analyze/report.py _top_pairs): only the pairs that may
rank among the first MAX_HOL_PAIRS are sorted, and only their ids ranked; the rows are
those of the full sort (blocked ms descending, then victim and culprit id), ties at the
cut included."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from omnitrace.analyze import report
from omnitrace.rules import headofline


def full_sort_rows(run, w, ttfp_of):
    """The rows as the report made them before: every pair ranked by a lexsort."""
    hp = w.hp
    rank = np.empty(len(run.chunk_requests), np.int64)
    rank[np.argsort(np.array(run.chunk_requests), kind="stable")] = np.arange(len(rank))
    vreq = np.array(w.victim_req, np.int64)[hp.victim]
    top = np.lexsort((rank[hp.culprit], rank[vreq], -(hp.pair_wall * report.NS_TO_MS)))[:report.MAX_HOL_PAIRS]
    return [{"victim": run.chunk_requests[int(vreq[j])], "culprit": run.chunk_requests[int(hp.culprit[j])],
             "blocked_ms": float(hp.pair_wall[j]) * report.NS_TO_MS,
             "chunk_time_sum_ms": int(hp.pair_chunk[j]) * report.NS_TO_MS,
             "tasks": int(hp.pair_tasks[j]), "victim_ttfp_ms": ttfp_of[run.chunk_requests[int(vreq[j])]]}
            for j in top.tolist()]


@pytest.mark.parametrize("seed", range(12))
def test_top_pairs_are_the_full_sort(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(report, "MAX_HOL_PAIRS", int(rng.choice([1, 7, 50, 1000])))
    n_req = int(rng.integers(2, 300))
    ids = [f"req-{int(x):05d}" for x in rng.permutation(100_000)[:n_req]]  # string order != index order
    n_victims, n_pairs = int(rng.integers(1, 60)), int(rng.integers(0, 3000))
    victim = np.sort(rng.integers(0, n_victims, n_pairs))
    pair_wall = rng.choice([0.0, 1000.0, 2500.0, 1e6 / 3], n_pairs) if seed % 2 else rng.random(n_pairs) * 1e6
    hp = headofline.Pairs(np.zeros(n_victims), np.zeros(n_victims, np.int64), np.zeros(n_victims, np.int64),
                          victim, rng.integers(0, n_req, n_pairs), pair_wall,
                          rng.integers(0, 10**9, n_pairs), rng.integers(1, 9, n_pairs))
    w = SimpleNamespace(hp=hp, victim_req=rng.integers(0, n_req, n_victims).tolist())
    run = SimpleNamespace(chunk_requests=ids)
    ttfp_of = {r: float(i) for i, r in enumerate(ids)}
    assert report._top_pairs(run, w, ttfp_of) == full_sort_rows(run, w, ttfp_of)
