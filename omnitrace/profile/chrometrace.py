"""py-spy ``chrometrace`` chunks -> timestamped samples, and the chunk's clock calibration.

What py-spy writes (0.4, ``record --subprocesses --idle --threads --format chrometrace``):
a JSON list of ``{"ph": "B"|"E", "name", "args": {"filename", "line"}, "pid", "tid", "ts"}``
where ``ts`` is microseconds since py-spy started and ``tid`` the pthread id. For each
sample and thread it writes ``E`` for the frames that left the stack and ``B`` for those
that entered, root first; the root frames are ``process PID:"cmdline"`` (ancestors first)
then ``thread (NATIVE_TID): name`` then the Python frames. A thread's stack that did not
change since its previous sample writes nothing, and at exit every open frame gets an ``E``.

So a chunk gives, per thread, the instants where its stack changed. It also gives every
sample's instant: py-spy samples all threads of all processes in one round and stamps them
together, and the runner's clock thread changes its stack in nearly every round, so the
distinct stamps, clustered, are the rounds (:func:`rounds`). A thread's stack at a round
without a change is the one it last changed to. :func:`parse` returns *stretches* (a
thread's stack from the round where it changed until the round where it changed again)
and the rounds; :func:`expand` gives back one sample per round.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson

ROUND_GAP_US = 100  # stamps of one round are microseconds apart; rounds ~1/rate apart
STRETCH_DTYPE = np.dtype([("t", "<i8"), ("end", "<i8"), ("pid", "<i4"), ("tid", "<i8"),
                          ("stack", "<i4")])


@dataclass
class Frames:
    """Interned frames (name, file, line) and stacks (tuples of frame ids, root first)."""

    frames: list[tuple[str, str, int]] = field(default_factory=list)
    stacks: list[tuple[int, ...]] = field(default_factory=list)
    _fidx: dict[tuple[str, str, int], int] = field(default_factory=dict)
    _sidx: dict[tuple[int, ...], int] = field(default_factory=dict)

    def frame(self, key: tuple[str, str, int]) -> int:
        i = self._fidx.get(key)
        if i is None:
            i = self._fidx[key] = len(self.frames)
            self.frames.append(key)
        return i

    def stack(self, key: tuple[int, ...]) -> int:
        i = self._sidx.get(key)
        if i is None:
            i = self._sidx[key] = len(self.stacks)
            self.stacks.append(key)
        return i


@dataclass
class Chunk:
    """One chunk's stretches, times still in py-spy microseconds."""

    stretches: np.ndarray  # STRETCH_DTYPE, t/end in us since py-spy's start
    rounds: np.ndarray  # every sampling round's stamp (us since py-spy's start), sorted
    threads: dict[tuple[int, int], str]  # (pid, native tid) -> thread name
    processes: dict[int, str]  # pid -> command line
    end_us: int


def _thread_frame(name: str) -> tuple[int, str] | None:
    # 'thread (12345): MainThread' (or 'thread (0x7F..)' when py-spy has no native id)
    if not name.startswith("thread (") or "): " not in name and not name.endswith(")"):
        return None
    inner = name[8:name.index(")")]
    try:
        tid = int(inner, 0)
    except ValueError:
        return None
    rest = name[name.index(")") + 1:]
    return tid, rest[2:] if rest.startswith(": ") else ""


def keep_read_name(names: dict[tuple[int, int], str], key: tuple[int, int], name: str) -> None:
    """Record a thread's name unless py-spy did not read it this time (``''``) and a name
    is known: py-spy leaves it out of the samples taken while it could not read the
    threading module's table (seen on an API process's MainThread under load)."""
    if name or key not in names:
        names[key] = name


def parse(path: str, frames: Frames) -> Chunk:
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".zst"):  # the runner compresses finished chunks
        import zstandard
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    events = orjson.loads(data)
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a py-spy chrometrace (a JSON list)")
    stacks: dict[int, list[str | tuple]] = {}  # py-spy tid -> open frames (raw)
    key_of: dict[int, tuple[int, int]] = {}  # py-spy tid -> (pid, native tid)
    threads: dict[tuple[int, int], str] = {}
    processes: dict[int, str] = {}
    rows: list[tuple[int, int, int, int]] = []  # (t, pid, native tid, stack id or -1)
    cur_tid = cur_ts = None
    end_us = 0

    def commit(ptid: int, ts: int) -> None:
        st = stacks.get(ptid) or []
        ident = key_of.get(ptid)
        if ident is None:
            return
        py = [x for x in st if isinstance(x, tuple)]
        sid = frames.stack(tuple(frames.frame(x) for x in py)) if py else -1
        rows.append((ts, ident[0], ident[1], sid))

    for ev in events:
        ptid, ts = ev["tid"], ev["ts"]
        if (ptid, ts) != (cur_tid, cur_ts):
            if cur_tid is not None:
                commit(cur_tid, cur_ts)
            cur_tid, cur_ts = ptid, ts
        if ts > end_us:
            end_us = ts
        st = stacks.setdefault(ptid, [])
        if ev["ph"] == "B":
            name = ev["name"]
            fname = ev["args"].get("filename") or ""
            if not fname and name.startswith("process "):
                pid_s, _, cmd = name[8:].partition(":")
                if pid_s.isdigit() and int(pid_s) == ev["pid"]:
                    processes[int(pid_s)] = cmd.strip('"')
                st.append(name)
            elif not fname and (th := _thread_frame(name)) is not None:
                key_of[ptid] = (int(ev["pid"]), th[0])
                keep_read_name(threads, key_of[ptid], th[1])
                st.append(name)
            else:
                st.append((name, fname, int(ev["args"].get("line") or 0)))
        elif st:
            st.pop()
    if cur_tid is not None:
        commit(cur_tid, cur_ts)
    arr = np.array(rows, dtype=[("t", "<i8"), ("pid", "<i4"), ("tid", "<i8"), ("stack", "<i4")])
    rnd = rounds(arr["t"])
    return Chunk(_stretches(arr, rnd), rnd, threads, processes, end_us)


def rounds(stamps: np.ndarray, gap_us: int = ROUND_GAP_US) -> np.ndarray:
    """Sampling rounds: the distinct stamps, those closer than ``gap_us`` merged (first kept)."""
    u = np.unique(stamps)
    if not len(u):
        return u.astype(np.int64)
    first = np.ones(len(u), bool)
    first[1:] = np.diff(u) > gap_us
    return u[first].astype(np.int64)


def _stretches(rows: np.ndarray, rnd: np.ndarray) -> np.ndarray:
    """Change points -> stretches [round of change, round of next change) per thread, on
    round stamps; an empty stack (-1, a closing E) ends one. A process that exited keeps
    its threads' last stacks open until py-spy writes the chunk: its stretches end at the
    round after its last change."""
    if not len(rows):
        return np.zeros(0, STRETCH_DTYPE)
    r = rows[np.lexsort((rows["t"], rows["tid"], rows["pid"]))]
    t = rnd[np.maximum(np.searchsorted(rnd, r["t"], "right") - 1, 0)]  # snap to the round
    same_next = np.zeros(len(r), bool)
    same_next[:-1] = (r["pid"][1:] == r["pid"][:-1]) & (r["tid"][1:] == r["tid"][:-1])
    nxt = np.empty(len(r), np.int64)
    nxt[:-1] = t[1:]
    keep = same_next & (r["stack"] >= 0)  # the last change of a thread is its closing E
    out = np.zeros(int(keep.sum()), STRETCH_DTYPE)
    for name in ("pid", "tid", "stack"):
        out[name] = r[name][keep]
    out["t"], out["end"] = t[keep], nxt[keep]
    # process caps: the round after the process's last real change (not the closing E)
    real = r["stack"] >= 0
    for pid in np.unique(out["pid"]).tolist():
        last = t[real & (r["pid"] == pid)].max()
        k = int(np.searchsorted(rnd, last, "right"))
        cap = int(rnd[k]) if k < len(rnd) else int(last) + 1
        m = out["pid"] == pid
        out["end"][m] = np.minimum(out["end"][m], cap)
    return out[out["end"] > out["t"]]


def expand(st: np.ndarray, rnd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stretches -> samples, one per round in [t, end). Returns indices into ``st`` and the
    sample times (same unit as ``st`` and ``rnd``)."""
    if not len(st):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo = np.searchsorted(rnd, st["t"], "left")
    hi = np.searchsorted(rnd, st["end"], "left")
    n = np.maximum(hi - lo, 0)
    idx = np.repeat(np.arange(len(st)), n)
    k = np.arange(len(idx)) - np.repeat(np.cumsum(n) - n, n)
    return idx, rnd[np.repeat(lo, n) + k]


# --------------------------------------------------------------------------- clock
@dataclass
class Calibration:
    offset_ns: int  # py-spy ts (us) * 1000 + offset_ns = perf_counter_ns
    uncertainty_ns: int  # width of the best-agreeing offsets
    observations: int  # clock-thread samples that fall between two recorded switches
    agreeing: int  # of them consistent with the chosen offset


def clock_functions(frames: Frames, prefix: str) -> np.ndarray:
    """Per interned stack, the clock function its leaf frame is (``<prefix><j>``: j), -1
    where it is no clock function."""
    fn = np.full(len(frames.stacks), -1, np.int64)
    for sid, stack in enumerate(frames.stacks):
        if stack:
            name = frames.frames[stack[-1]][0]
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                fn[sid] = int(name[len(prefix):])
    return fn


def calibrate(chunk: Chunk, frames: Frames, clock_pid: int, flips_ns: np.ndarray, prefix: str,
              k_funcs: int, guess_ns: int, search_ns: int = 2_000_000_000,
              max_obs: int = 4000) -> Calibration | None:
    """The offset from py-spy's clock to perf_counter_ns that best agrees with the clock
    thread: a sample of it showing function j must fall between a flip into j (flip k with
    k % K == j) and the next flip. ``guess_ns``: roughly when py-spy started (perf ns)."""
    F = np.asarray(flips_ns, np.int64)
    if len(F) < 3:
        return None
    fn = clock_functions(frames, prefix)
    st = chunk.stretches
    st = st[st["pid"] == clock_pid]
    kind = fn[st["stack"]] if len(st) else np.zeros(0, np.int64)
    ok = kind >= 0
    ts, kind = st["t"][ok] * 1000, kind[ok]
    if len(ts) < 3:
        return None
    if len(ts) > max_obs:  # plenty: spread over the chunk
        pick = np.linspace(0, len(ts) - 1, max_obs).astype(np.int64)
        ts, kind = ts[pick], kind[pick]
    # offsets B with state(ts_j + B) == kind_j: union over flips k of that function of
    # [F_k - ts_j, F_{k+1} - ts_j)
    lo = np.maximum(np.searchsorted(F, ts + guess_ns - search_ns) - 1, 0)
    hi = np.searchsorted(F, ts + guess_ns + search_ns)
    cnt = np.maximum(hi - lo, 0)
    j = np.repeat(np.arange(len(ts)), cnt)
    k = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(lo, cnt)
    sel = ((k % k_funcs) == kind[j]) & (k + 1 < len(F))
    j, k = j[sel], k[sel]
    if not len(j):
        return None
    starts = F[k] - ts[j]
    ends = F[k + 1] - ts[j]
    pos = np.concatenate((starts, ends))
    delta = np.concatenate((np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)))
    order = np.lexsort((delta, pos))  # at equal positions, ends (-1) before starts
    pos, delta = pos[order], delta[order]
    cover = np.cumsum(delta)
    best = int(cover.max())
    i = int(np.argmax(cover))
    # the best-covered segment [pos[i], pos[i+1]); take its middle
    right = pos[i + 1] if i + 1 < len(pos) else pos[i]
    mid = (int(pos[i]) + int(right)) // 2
    # only samples between the first and the last recorded switch can agree or not: a
    # process killed before its last switches were written leaves samples no switch explains
    # (every agreeing sample is one of them: it lies between switch k and k + 1)
    checkable = int(np.count_nonzero((ts + mid >= F[0]) & (ts + mid < F[-1])))
    return Calibration(offset_ns=mid, uncertainty_ns=int(right - pos[i]), observations=checkable,
                       agreeing=best)


def consistent_rounds(chunk: Chunk, frames: Frames, pid: int, flips_ns: np.ndarray, prefix: str,
                      k_funcs: int, offset_ns: int) -> np.ndarray:
    """Per round of ``chunk``: does its stamp agree with what the clock thread showed in it?
    py-spy stamps a sample when it handles it, sometimes milliseconds after reading it (its
    own threads were not scheduled); such a round shows the clock function of an earlier
    switch than its stamp says. Those rounds keep their stacks (whole-process profiles) but
    cannot be placed inside spans. Rounds with no clock sample are kept."""
    F = np.asarray(flips_ns, np.int64)
    rnd = chunk.rounds
    ok = np.ones(len(rnd), bool)
    if len(F) < 2 or not len(rnd):
        return ok
    fn = clock_functions(frames, prefix)
    cs = chunk.stretches[chunk.stretches["pid"] == pid]
    cs = cs[fn[cs["stack"]] >= 0] if len(cs) else cs
    if not len(cs):
        return ok
    cs = cs[np.argsort(cs["t"], kind="stable")]
    i = np.searchsorted(cs["t"], rnd, "right") - 1
    inside = (i >= 0) & (rnd < cs["end"][np.maximum(i, 0)])
    j = np.where(inside, fn[cs["stack"][np.maximum(i, 0)]], -1)
    k = np.searchsorted(F, rnd * 1000 + offset_ns, "right") - 1
    ok = (j < 0) | ((k >= 0) & ((k % k_funcs) == j))
    return ok
