"""``profiles/samples.npz``: every sampled stack of the run with its time, process and thread.

Stored as *stretches* (``chrometrace.STRETCH_DTYPE``: a thread's stack from the sampling
round where it changed until the round where it changed again), the rounds (every
sample's instant), all in unix ns on the event log's clock, and the interned frames and
stacks. ``samples()`` gives back one sample per round (``chrometrace.expand``); each
sample stands for one sampling period (``period_ns``). ``unsampled``: the stretches of
each process's time in which py-spy provably took no sample (it fell behind).
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass, field

import numpy as np
import orjson

from omnitrace.profile.chrometrace import STRETCH_DTYPE, expand

FILE = "samples.npz"
ROUND_DTYPE = np.dtype([("pid", "<i4"), ("t", "<i8")])  # a sampling round of one process
# a stretch of a process's time in which py-spy provably took no sample (finalize.unsampled)
GAP_DTYPE = np.dtype([("pid", "<i4"), ("t", "<i8"), ("end", "<i8")])


def save_npz(path: str, meta: dict, **arrays: np.ndarray) -> None:
    """``arrays`` and ``meta`` (JSON, as the uint8 array ``meta``) in one compressed .npz,
    replaced atomically (a reader never sees half a file)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.frombuffer(orjson.dumps(meta), np.uint8), **arrays)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)


@dataclass
class Store:
    stretches: np.ndarray  # STRETCH_DTYPE, unix ns
    rounds: np.ndarray  # ROUND_DTYPE: every sampling round of each process, sorted (pid, t)
    frames: list[tuple[str, str, int]]  # (function, file, line)
    stacks: list[tuple[int, ...]]  # frame ids, root first
    period_ns: int  # one sampling period
    threads: dict[tuple[int, int], str]  # (pid, native tid) -> thread name
    unsampled: np.ndarray = field(default_factory=lambda: np.zeros(0, GAP_DTYPE))  # sorted (pid, t)

    def samples(self, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(stretch index, sample time) of every sample of the stretches in ``mask``: one per
        sampling round of the stretch's process that py-spy wrote (a round where some thread
        of the process changed its stack)."""
        sel = np.flatnonzero(mask) if mask is not None else np.arange(len(self.stretches))
        out_i, out_t = [], []
        pids = self.stretches["pid"][sel]
        for pid in np.unique(pids).tolist():
            rows = sel[pids == pid]
            lo, hi = np.searchsorted(self.rounds["pid"], (pid, pid + 1))
            i, t = expand(self.stretches[rows], self.rounds["t"][lo:hi])
            out_i.append(rows[i])
            out_t.append(t)
        if not out_i:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(out_i), np.concatenate(out_t)

    def gaps(self, pid: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the process's unsampled time, sorted and disjoint."""
        lo, hi = np.searchsorted(self.unsampled["pid"], (pid, pid + 1))
        return self.unsampled["t"][lo:hi], self.unsampled["end"][lo:hi]

    def frame_label(self, fid: int) -> str:
        name, path, _ = self.frames[fid]
        return f"{name} ({os.path.basename(path)})" if path else name

    def save(self, path: str) -> None:
        save_npz(path, {"frames": self.frames, "stacks": self.stacks, "period_ns": self.period_ns,
                        "threads": [[p, t, n] for (p, t), n in self.threads.items()]},
                 stretches=self.stretches, rounds=self.rounds, unsampled=self.unsampled)

    @classmethod
    def load(cls, path: str) -> "Store":
        with np.load(path, allow_pickle=False) as z:
            st = z["stretches"].astype(STRETCH_DTYPE, copy=False)
            rounds = z["rounds"].astype(ROUND_DTYPE, copy=False)
            meta = orjson.loads(z["meta"].tobytes())
            gaps = z["unsampled"].astype(GAP_DTYPE, copy=False) if "unsampled" in z else np.zeros(0, GAP_DTYPE)
        return cls(st, rounds, [tuple(f) for f in meta["frames"]], [tuple(s) for s in meta["stacks"]],
                   int(meta["period_ns"]), {(p, t): n for p, t, n in meta["threads"]}, gaps)


def in_order(store: Store, idx: np.ndarray, weights: np.ndarray) -> list[tuple[tuple[str, ...], float]]:
    """Samples (stretch indices, in time order) -> [(stack of labels, seconds)], runs of
    one stack joined: the order kept, the size bounded by the stack changes."""
    out: list[tuple[tuple[str, ...], float]] = []
    labels: dict[int, tuple[str, ...]] = {}
    prev = -1
    for s, w in zip(store.stretches["stack"][idx].tolist(), weights.tolist()):
        if s == prev:
            out[-1] = (out[-1][0], out[-1][1] + w)
            continue
        lab = labels.get(s)
        if lab is None:
            lab = labels[s] = tuple(store.frame_label(f) for f in store.stacks[s])
        out.append((lab, w))
        prev = s
    return out


def collapsed(store: Store, idx: np.ndarray, weights: np.ndarray | None = None,
              root: np.ndarray | None = None, root_labels: list[str] | None = None
              ) -> dict[tuple[str, ...], float]:
    """Samples (stretch indices) -> {stack of labels, root first: seconds}. ``root``: an
    optional extra root frame per sample (e.g. its thread), an index into ``root_labels``."""
    if not len(idx):
        return {}
    sid = store.stretches["stack"][idx].astype(np.int64)
    w = np.full(len(idx), store.period_ns / 1e9) if weights is None else weights
    key = sid if root is None else sid * 4096 + root
    uniq, inv = np.unique(key, return_inverse=True)
    tot = np.bincount(inv, weights=w)
    out: dict[tuple[str, ...], float] = {}
    labels: dict[int, str] = {}
    for k, v in zip(uniq.tolist(), tot.tolist()):
        s, r = (k, None) if root is None else divmod(k, 4096)
        names = []
        for fid in store.stacks[s]:
            lab = labels.get(fid)
            if lab is None:
                lab = labels[fid] = store.frame_label(fid)
            names.append(lab)
        path = tuple(names) if r is None else (root_labels[r],) + tuple(names)  # type: ignore[index]
        out[path] = out.get(path, 0.0) + v
    return out

