"""After the run: py-spy chunks (and pyinstrument sessions) -> ``profiles/``.

* each chunk is parsed and its clock calibrated against the runner's clock thread
  (``chrometrace.calibrate``), then cut to its own time slot (rotation overlaps chunks);
* times go to unix ns with the event log's own offset, so samples and spans share one clock;
* processes are named from what the agent saw in their rings (``processes.jsonl``): the API
  server is ``api``, a stage its stage name (``thinker``), or ``stage{S}`` for vLLM-Omni's
  ``StageEngineCoreProc_stage{S}_replica{R}``; other processes (the bench, the runner,
  helpers) are not kept;
* ``--flame-window measured`` keeps only the bench's measured window(s);
* writes ``samples.npz`` (every stack with its time, pid and native thread id: what
  `omnitrace flame` selects from), per profile ``NAME.speedscope.json`` (a timeline per thread) and ``NAME.svg``,
  and ``index.json`` (what is there, what is missing and why, the clock's precision).
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from omnitrace.profile import chrometrace as ct
from omnitrace.profile import clock, render, waiting
from omnitrace.profile.config import RAW_DIR
from omnitrace.profile.runner import CUTOVER_S, PYSPY_COUNTS
from omnitrace.profile.store import FILE as SAMPLES_FILE
from omnitrace.profile.store import GAP_DTYPE, ROUND_DTYPE, Store, collapsed
from omnitrace.runfiles.names import BENCH, PROFILES, PROFILES_INDEX
from omnitrace.runfiles.read import read_or_empty, read_processes, read_profiles_index

# A chunk's clock is calibrated when the best offset explains at least this share of the
# clock thread's samples. A wrong offset explains ~5% (K = 32 functions); under heavy load
# py-spy stamps many rounds late, which no offset explains (those rounds are then kept out
# of span placement by ``consistent_rounds``), so a majority is not required.
MIN_AGREEING = 0.25
KEPT_ROLES = ("api", "stage")
# how late py-spy stamps a round it read (0.2-3 ms seen on a loaded 2-core VM), and how many
# periods py-spy's random wait may take by chance (exp(-7): ~0.1%): no time is called
# unsampled before a clock switch plus these
LATE_STAMP_NS = 5_000_000
STALL_PERIODS = 7
_VLLM_STAGE = re.compile(r"StageEngineCoreProc_stage(\d+)_replica(\d+)")
_SIMPLE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,40}")


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return None


def log_offset(run_dir: str) -> int | None:
    """The event log's unix-minus-perf_counter offset (its first HEADER block)."""
    import zstandard

    from omnitrace import eventlog
    segs = eventlog.segments(run_dir)
    if not segs:
        return None
    try:
        with open(segs[0], "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
            head = r.read(eventlog.BLOCK.size)
            kind, _, length = eventlog.BLOCK.unpack(head)
            if kind != eventlog.HEADER:
                return None
            return int(orjson.loads(r.read(length))["offset_ns"])
    except (OSError, ValueError, KeyError, zstandard.ZstdError):
        return None


def profile_name(proc: dict) -> str:
    if proc.get("role") == "api":
        return "api" if not proc.get("replica") else f"api-replica{proc['replica']}"
    stage, replica = int(proc.get("stage", -1)), int(proc.get("replica") or 0)
    name = str(proc.get("name") or "")
    # the stage's own name (the reference pipeline's), not vLLM-Omni's process name nor
    # the bootstrap's guess from the command line (python, vllm, a script)
    if (_VLLM_STAGE.fullmatch(name) or not _SIMPLE.fullmatch(name) or name in ("api", "vllm")
            or name.startswith("python") or "." in name):
        base = f"stage{stage}"
    else:
        base = name
    return base if not replica else f"{base}-replica{replica}"


def _processes(run_dir: str) -> dict[int, dict]:
    return {p["pid"]: p for p in read_processes(run_dir)
            if p.get("role") in KEPT_ROLES and isinstance(p.get("pid"), int)}


def _windows(run_dir: str) -> list[tuple[int, int]]:
    bench = read_or_empty(run_dir, BENCH)
    out = []
    for lv in bench.get("levels") or ():
        w = (lv or {}).get("measured_window") or {}
        if w.get("start_unix_ns") and w.get("end_unix_ns"):
            out.append((int(w["start_unix_ns"]), int(w["end_unix_ns"])))
    return out


def _pyspy_counts(notes: list[dict], pid: int) -> dict[str, int]:
    """py-spy's own counts over a process's chunks: samples it took, and how many of them it
    could not read (a stack read while it changed: ``--nonblocking``); absent where py-spy
    did not say (killed)."""
    mine = [n for n in notes if n.get("pid") == pid and "pyspy_samples" in n]
    if not mine:
        return {}
    out = {"pyspy_samples": sum(n["pyspy_samples"] for n in mine),
           "pyspy_errors": sum(n["pyspy_errors"] for n in mine)}
    behind = [n for n in mine if n.get("pyspy_behind")]
    if behind:
        out.update(pyspy_behind=sum(n["pyspy_behind"] for n in behind),
                   pyspy_behind_max_s=max(n["pyspy_behind_max_s"] for n in behind))
    return out


def _clip(st: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Rows with ``t``/``end`` (stretches, unsampled gaps) cut to [lo, hi)."""
    st = st[(st["end"] > lo) & (st["t"] < hi)].copy()
    # a stretch cut at the slot's start begins at its next (expanded) sample, not before
    st["t"] = np.maximum(st["t"], lo)
    st["end"] = np.minimum(st["end"], hi)
    return st[st["end"] > st["t"]]


def unsampled(rounds: np.ndarray, flips: np.ndarray, period_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the time in which py-spy provably took no sample of a process:
    ``rounds``, its written rounds, sorted; ``flips``, its clock thread's switches, sorted,
    both in one clock.

    py-spy writes a round when some thread's stack changed, and every switch of the clock
    thread is a change, so a sample taken after a switch is always written. py-spy samples
    at random, exponentially distributed intervals (mean: one period), so the wait from a
    switch to the next sample exceeds ``STALL_PERIODS`` periods by chance once in ~1,100
    switches. A gap between two written rounds that holds a switch therefore had no sample
    from that long (and a stamp's lateness, ``LATE_STAMP_NS``) after the switch until the
    next round: py-spy fell behind (seen: 0.5-40 s at a time beside the real vLLM-Omni
    server under load). A gap without a switch is not counted: the clock thread could not
    run (a thread held the GIL), so no stack changed and py-spy may well have sampled."""
    if len(rounds) < 2 or not len(flips):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = np.searchsorted(flips, rounds[:-1], "right")
    has = k < len(flips)
    start = flips[np.minimum(k, len(flips) - 1)] + STALL_PERIODS * period_ns + LATE_STAMP_NS
    end = rounds[1:]
    m = has & (start < end)
    return start[m], end[m]


def load_chunks(run_dir: str, runner: dict, offset_unix: int, frames: ct.Frames
                ) -> tuple[np.ndarray, np.ndarray, dict, list[dict], np.ndarray]:
    """Every process's chunks: stretches and rounds in unix ns, each chunk cut to its own
    slot (rotation overlaps a process's chunks); (stretches, rounds as ROUND_DTYPE, threads,
    clock notes per chunk, unsampled time as GAP_DTYPE). The clock threads' own samples are
    dropped once used."""
    raw = os.path.join(run_dir, RAW_DIR)
    by_pid: dict[int, list[dict]] = {}
    for c in runner.get("chunks") or ():
        if c.get("ready_ns"):
            by_pid.setdefault(int(c["pid"]), []).append(c)
    parts, rparts, notes, pending = [], [], [], []
    flips_by_pid: dict[int, np.ndarray] = {}
    offsets: list[int] = []  # calibrated (py-spy zero - its start), for chunks without a clock
    for pid, chunks in sorted(by_pid.items()):
        chunks.sort(key=lambda c: c["index"])
        try:
            flips = np.fromfile(os.path.join(raw, f"clock-{pid}.bin"), dtype="<i8")
        except (OSError, ValueError):
            flips = np.zeros(0, np.int64)
        flips_by_pid[pid] = np.sort(flips) + offset_unix
        for i, c in enumerate(chunks):
            path = os.path.join(raw, c["path"])
            if not os.path.exists(path):
                notes.append({"pid": pid, "chunk": c["index"], "error": c.get("error") or "chunk file missing"})
                continue
            chunk = ct.parse(path, frames)
            cal = ct.calibrate(chunk, frames, pid, flips, clock.PREFIX, clock.K, int(c["started_ns"]))
            note: dict[str, Any] = {"pid": pid, "chunk": c["index"], "pyspy_priority": c.get("priority"),
                                    **{k: c[k] for k in PYSPY_COUNTS if k in c}}
            if cal is not None and cal.agreeing >= MIN_AGREEING * cal.observations:
                off = cal.offset_ns
                offsets.append(off - int(c["started_ns"]))
                note.update(calibrated=True, uncertainty_ms=round(cal.uncertainty_ns / 1e6, 4),
                            clock_samples=cal.observations, agreeing=cal.agreeing)
            else:
                off = None
                note.update(calibrated=False, error="no clock switches from this process (killed "
                            "before exit?)" if not len(flips) else "clock samples disagree")
                if cal is not None:  # how far from agreeing, for whoever reads index.json
                    note.update(clock_samples=cal.observations, agreeing=cal.agreeing)
            notes.append(note)
            lo = -(1 << 62) if i == 0 else int(c["ready_ns"] + CUTOVER_S * 1e9)
            hi = (1 << 62) if i + 1 == len(chunks) else int(chunks[i + 1]["ready_ns"] + CUTOVER_S * 1e9)
            good = None
            if off is not None:
                good = ct.consistent_rounds(chunk, frames, pid, flips, clock.PREFIX, clock.K, off)
                note["late_rounds"] = int((~good).sum())
            pending.append((chunk, off, int(c["started_ns"]), lo, hi, note, good))
    typical = int(np.median(offsets)) if offsets else 0
    names = thread_names(p[0].threads for p in pending)
    for chunk, off, started, lo, hi, note, good in pending:
        if off is None:  # py-spy's zero: its start plus the typical start-up delay of the others
            off = started + typical
            note["assumed_offset_ms"] = round(typical / 1e6, 3)
        keep = np.array([names.get((int(p), int(t))) != clock.THREAD
                         for p, t in zip(chunk.stretches["pid"], chunk.stretches["tid"])], bool)
        st = chunk.stretches[keep] if len(chunk.stretches) else chunk.stretches
        shift = off + offset_unix
        st["t"] = st["t"] * 1000 + shift
        st["end"] = st["end"] * 1000 + shift
        lo_u, hi_u = lo + offset_unix if lo > -(1 << 62) else lo, hi + offset_unix if hi < (1 << 62) else hi
        parts.append(_clip(st, lo_u, hi_u))
        if len(parts[-1]):  # the time this chunk's samples cover: a selection can name its clock
            note.update(from_unix_ns=int(parts[-1]["t"].min()), to_unix_ns=int(parts[-1]["end"].max()))
        rnd = np.sort(chunk.rounds if good is None else chunk.rounds[good]) * 1000 + shift
        rnd = rnd[(rnd >= lo_u) & (rnd < hi_u)]
        r = np.zeros(len(rnd), ROUND_DTYPE)
        r["t"], r["pid"] = rnd, int(chunk.stretches["pid"][0]) if len(chunk.stretches) else 0
        rparts.append(r)
    threads = {k: v for k, v in names.items() if v != clock.THREAD}
    st = np.concatenate(parts) if parts else np.zeros(0, ct.STRETCH_DTYPE)
    rnd = np.sort(np.concatenate(rparts) if rparts else np.zeros(0, ROUND_DTYPE), order=["pid", "t"])
    return st, rnd, threads, notes, _unsampled_by_pid(rnd, flips_by_pid, int(1e9 // int(runner.get("rate") or 100)))


def thread_names(per_chunk: Iterable[dict[tuple[int, int], str]]) -> dict[tuple[int, int], str]:
    """(pid, native tid) -> name over the chunks, in order; a name read in one chunk
    stands where another did not read it (a clock thread's too, so its samples are dropped)."""
    out: dict[tuple[int, int], str] = {}
    for threads in per_chunk:
        for key, name in threads.items():
            ct.keep_read_name(out, key, name)
    return out


def _unsampled_by_pid(rnd: np.ndarray, flips_by_pid: dict[int, np.ndarray], period_ns: int) -> np.ndarray:
    """GAP_DTYPE rows for every process, over all its chunks' rounds (the ones selections
    use: a late-stamped round's time is no better known than a missing one's)."""
    parts = []
    for pid, flips in flips_by_pid.items():
        lo, hi = np.searchsorted(rnd["pid"], (pid, pid + 1))
        a, b = unsampled(rnd["t"][lo:hi], flips, period_ns)
        g = np.zeros(len(a), GAP_DTYPE)
        g["pid"], g["t"], g["end"] = pid, a, b
        parts.append(g)
    gaps = np.concatenate(parts) if parts else np.zeros(0, GAP_DTYPE)
    return np.sort(gaps, order=["pid", "t"])


def finalize(run_dir: str) -> dict:
    """Write profiles/ from profiles/raw/; returns the index (also written as index.json)."""
    pdir = os.path.join(run_dir, PROFILES)
    raw = os.path.join(run_dir, RAW_DIR)
    runner = _read_json(os.path.join(raw, "runner.json")) or {}
    offset = log_offset(run_dir)
    if offset is None:
        offset = int(runner.get("offset_ns") or 0)
    rate = int(runner.get("rate") or 100)
    frames = ct.Frames()
    st, rnd, threads, notes, gaps = load_chunks(run_dir, runner, offset, frames)
    procs = _processes(run_dir)
    cfg = runner.get("config") or {}
    windows = _windows(run_dir) if cfg.get("window") == "measured" else []
    index: dict[str, Any] = {"tool": "py-spy", "rate": rate, "mode": runner.get("mode"),
                             "window": cfg.get("window", "run"), "clock": notes,
                             "profiles": [], "missing": [], "samples": SAMPLES_FILE}
    if cfg.get("window") == "measured" and windows:
        st, rnd, gaps = _in_windows(windows, st, rnd, gaps)
        index["windows_unix_ns"] = windows
    elif cfg.get("window") == "measured":
        index["window_note"] = "no measured window in bench.json: the whole run is kept"
    st = st[np.isin(st["pid"], np.fromiter(procs, np.int64, len(procs)))] if len(st) else st
    store = Store(st, rnd, frames.frames, frames.stacks, int(1e9 // rate),
                  {k: v for k, v in threads.items() if k[0] in procs}, gaps)
    os.makedirs(pdir, exist_ok=True)
    store.save(os.path.join(pdir, SAMPLES_FILE))
    names = _profile_names(procs)
    inproc = _inproc_profiles(raw)
    for pid, name in names.items():
        p = procs[pid]
        entry = {"name": name, "role": p.get("role"), "stage": p.get("stage"), "replica": p.get("replica"),
                 "pid": pid, "process": p.get("name")}
        mask = st["pid"] == pid
        if mask.any():
            stacks, tlist = _by_thread(store, mask)
            gs, ge = store.gaps(pid)
            waiting_s = _write(pdir, name, stacks, _timeline(store, mask, tlist), f"{name} (pid {pid})",
                               f"py-spy {rate} Hz")
            entry.update(tool="py-spy", seconds=round(sum(stacks.values()), 3),
                         waiting_s=round(waiting_s, 3),
                         rounds_known=_rounds_known(store, pid, rate),
                         unsampled_s=round(float((ge - gs).sum()) / 1e9, 3),
                         **_pyspy_counts(notes, pid),
                         threads=[{"tid": t, "name": n} for t, n in tlist])
            index["profiles"].append(entry)
            if pid in inproc:
                _write_inproc(pdir, f"{name}.pyinstrument", inproc.pop(pid), index, entry)
            continue
        why = runner.get("error") or (runner.get("failed") or {}).get(str(pid)) or (
            "py-spy took no sample of it (it ended before py-spy attached, or it was not "
            "announced: a forked child, or started without the bootstrap)")
        if not runner:
            why = "the profile runner wrote nothing (killed?)"
        missing = {**entry, "reason": why}
        if pid in inproc:  # the fallback: pyinstrument on the thread that named the process
            missing["replaced_by"] = "pyinstrument (main thread only)"
            _write_inproc(pdir, name, inproc.pop(pid), index, entry)
            entry["note"] = f"pyinstrument, main thread only: py-spy could not sample ({why})"
        elif runner.get("error"):
            missing["reason"] += "; the pyinstrument fallback wrote no profile either (killed before exit?)"
        index["missing"].append(missing)
    try:  # what span-linked selections need, read from the event log once
        from omnitrace.profile import linked
        linked.build_index(run_dir).save(os.path.join(pdir, linked.INDEX_FILE))
        index["spans"] = linked.INDEX_FILE
    except Exception as exc:  # the profiles stand without it; `omnitrace flame` builds it then
        index.setdefault("notes", []).append(f"span index not written: {type(exc).__name__}: {exc}")
    _write_json(os.path.join(run_dir, PROFILES_INDEX), index)
    if not os.environ.get("OMNITRACE_FLAME_KEEP_RAW"):
        shutil.rmtree(raw, ignore_errors=True)
    return index


def _in_windows(windows: list[tuple[int, int]], st: np.ndarray, rnd: np.ndarray, gaps: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The samples, rounds and unsampled gaps inside the measured ``windows`` only."""
    inside = np.zeros(len(rnd), bool)
    for lo, hi in windows:
        inside |= (rnd["t"] >= lo) & (rnd["t"] < hi)
    return (np.concatenate([_clip(st, lo, hi) for lo, hi in windows]), rnd[inside],
            np.sort(np.concatenate([_clip(gaps, lo, hi) for lo, hi in windows]), order=["pid", "t"]))


def _profile_names(procs: dict[int, dict]) -> dict[int, str]:
    """pid -> its profile's file name: the process's name, made unique with its pid."""
    names: dict[int, str] = {}
    used: set[str] = set()
    for pid, p in sorted(procs.items(), key=lambda kv: (kv[1].get("stage", -1), kv[0])):
        name = profile_name(p)
        if name in used:
            name = f"{name}-{pid}"
        used.add(name)
        names[pid] = name
    return names


def _rounds_known(store: Store, pid: int, rate: float) -> float | None:
    """The process's written rounds over the nominal ``rate`` x its sampled time. The rest
    py-spy either skipped (no thread of the process changed: the stacks held) or missed
    (it fell behind); a selection's seconds count both by the real gaps."""
    t = store.rounds["t"][store.rounds["pid"] == pid]
    span_s = (int(t[-1]) - int(t[0])) / 1e9 if len(t) > 1 else 0.0
    return round(min(1.0, len(t) / (span_s * rate)), 3) if span_s > 0 else None


def _by_thread(store: Store, mask: np.ndarray) -> tuple[render.Collapsed, list[tuple[int, str]]]:
    """A process's stacks by thread, each stretch weighted by its duration: unbiased for the
    time per stack (a change is seen one sampling gap late, at entry and exit alike), and
    it counts the samples py-spy took but did not write (no thread changed)."""
    idx = np.flatnonzero(mask)
    st = store.stretches
    weights = (st["end"][idx] - st["t"][idx]) / 1e9
    pid = int(store.stretches["pid"][idx[0]]) if len(idx) else 0
    tids = store.stretches["tid"][idx]
    order = np.unique(tids).tolist()
    tlist = [(t, store.threads.get((pid, t), "")) for t in order]
    labels = [f"thread {n or '?'} ({t})" for t, n in tlist]
    root = np.searchsorted(np.array(order), tids)
    return collapsed(store, idx, weights, root=root, root_labels=labels), tlist


def _timeline(store: Store, mask: np.ndarray, tlist: list[tuple[int, str]]
              ) -> list[tuple[str, list[render.Stretch]]]:
    """Per thread (named as in ``_by_thread``), its stretches of one stack in time order."""
    idx = np.flatnonzero(mask)
    st = store.stretches
    labels: dict[int, tuple[str, ...]] = {}
    out = []
    for tid, tname in tlist:
        rows = idx[st["tid"][idx] == tid]
        rows = rows[np.argsort(st["t"][rows], kind="stable")]
        stretches = []
        for t, end, sid in zip(st["t"][rows].tolist(), st["end"][rows].tolist(), st["stack"][rows].tolist()):
            stack = labels.get(sid)
            if stack is None:
                stack = labels[sid] = tuple(store.frame_label(f) for f in store.stacks[sid])
            stretches.append((t, end, stack))
        out.append((f"thread {tname or '?'} ({tid})", stretches))
    return out


def _write(pdir: str, name: str, stacks: render.Collapsed,
           timeline: list[tuple[str, list[render.Stretch]]], title: str, sub: str) -> float:
    """The process's speedscope timeline and SVG (waiting stacks on request); returns the
    seconds of waiting stacks."""
    # speedscope: one timeline per thread (its time-order view is what happened)
    _write_json(os.path.join(pdir, f"{name}.speedscope.json"), render.speedscope_timeline(timeline, title))
    work, wait = waiting.split(stacks)
    sub = (f"{sub}; {len(timeline)} threads, {sum(work.values()):.1f} s working"
           + (f", {sum(wait.values()):.1f} s waiting (hidden)" if wait else ""))
    with open(os.path.join(pdir, f"{name}.svg"), "w", encoding="utf-8") as f:
        f.write(render.svg(work, title, sub, hidden=wait))
    return sum(wait.values())


def _inproc_profiles(raw: str) -> dict[int, str]:
    out = {}
    try:
        names = os.listdir(raw)
    except OSError:
        return out
    for n in names:
        m = re.fullmatch(r"pyinstrument-(\d+)\.json", n)
        if m:
            out[int(m.group(1))] = os.path.join(raw, n)
    return out


def _write_inproc(pdir: str, name: str, path: str, index: dict, entry: dict) -> None:
    from omnitrace.profile.inproc import load_collapsed
    try:
        stacks, doc = load_collapsed(path)
    except Exception as exc:  # a torn session file: say so, keep the rest
        index.setdefault("notes", []).append(f"{name}: pyinstrument session unreadable ({exc})")
        return
    _write_json(os.path.join(pdir, f"{name}.speedscope.json"), doc)
    with open(os.path.join(pdir, f"{name}.svg"), "w", encoding="utf-8") as f:
        f.write(render.svg(stacks, f"{name} (pid {entry['pid']})", "pyinstrument, async mode"
                           if name.startswith("api") else "pyinstrument (main thread)"))
    entry.setdefault("extra", []).append(name)
    if "tool" not in entry:
        entry.update(tool="pyinstrument", seconds=round(sum(stacks.values()), 3))
        index["profiles"].append(entry)


def _write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(obj))
    os.replace(tmp, path)


def warnings_for(run_dir: str) -> list[str]:
    """One line per missing profile of a --flame run (for the report's warnings)."""
    index = read_profiles_index(run_dir) or {}
    out = []
    for m in index.get("missing") or ():
        line = f"flame graph of {m.get('name')} (pid {m.get('pid')}) missing: {m.get('reason')}"
        if m.get("replaced_by"):
            line += f"; {m['replaced_by']} in its place"
        out.append(line)
    return out
