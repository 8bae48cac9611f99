"""Load one or several run directories (docs/run-directory.md) into plain Python data.

Collect -> data: this module only parses. It never raises on a damaged directory: a
missing file, a truncated last line (agent killed mid-write) or a malformed span becomes a
labelled warning in :attr:`Run.warnings`, and whatever could be read is kept.

A run directory's event log is read by the one loader (``spanload``) into the report's
tables (``tables.ReportTables``); a run recorded before the event log (spans.jsonl) is
imported into the same tables (``otlp_import``). Past that, every run is the same: request,
stage and queue spans as slotted :class:`Span` objects, chunk spans as rows.
"""
from __future__ import annotations

import bisect
import gc
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import orjson

from omnitrace import conventions as cv
from omnitrace import rowops
from omnitrace import spantable as stt
from omnitrace.runfiles import live_agent
from omnitrace.analyze import fieldtypes, headofline, tables
from omnitrace.analyze.span import Span  # noqa: F401  (the loader's data model, re-exported)


class RunDirError(Exception):
    """A run directory that cannot be analysed at all (one clear line for the user)."""


@dataclass
class Run:
    """Everything read from the run directories, merged."""

    paths: list[str]
    run_json: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    agent: list[dict[str, Any]] = field(default_factory=list)
    bench: dict[str, Any] | None = None
    spans: list[Span] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    span_lines: int = 0
    skipped_spans: int = 0  # spans of warm-up requests, not loaded
    events: int = 0  # events read from event logs
    torn_records: int = 0  # records lost in torn event segments
    ledger: Any = None  # accounting.Ledger: where every event written went (event-log runs)
    # what the per-stage figures read of the chunk spans (tables.ChunkFigures; req indexes
    # chunk_requests; every request: the selection is the report's); ``spans`` holds objects
    # only for request, stage and queue spans
    figures: Any = None
    # the senders' busy intervals, per (stage, replica) (headofline.Busy; warm-up tasks
    # included: they can block a measured request in a FIFO)
    busy: dict = field(default_factory=dict)
    # chunk spans that began before their request's first packet, whole (SPAN_DTYPE; warm-up
    # requests left out): the walk, the head-of-line waits and the waterfalls read them
    early: Any = None
    chunk_requests: list[str] = field(default_factory=lambda: [""])
    span_count: int = 0
    stage_deaths: list[tuple[int, int]] = field(default_factory=list)  # (stage, unix ns) STAGE_DIED

    def chunk_index(self) -> dict[str, int]:
        """Request id -> its index in ``chunk_requests`` (the tables' ``req``)."""
        return {r: i for i, r in enumerate(self.chunk_requests)}


def _read_lines(path: str, label: str, warnings: list[str]) -> Iterable[tuple[int, bytes]]:
    """Yield (line number, raw line), streaming; a final line without newline may be a torn write."""
    with open(path, "rb", buffering=1 << 20) as f:
        for i, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                # Possibly half-written (writer killed): keep it only if it parses.
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError:
                    if line.strip():
                        warnings.append(f"{label}: last line {i} is truncated (writer killed mid-write?); ignored")
                    return
            if line.strip():
                yield i, line


def _load_json(path: str, label: str, warnings: list[str]) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            v = orjson.loads(f.read())
        if not isinstance(v, dict):
            raise RunDirError(f"{label}: a JSON {type(v).__name__}, not the object omnitrace writes")
        return v
    except (orjson.JSONDecodeError, OSError) as e:
        warnings.append(f"{label}: unreadable ({e.__class__.__name__}: {str(e)[:80]}); ignored")
        return None


def load_spans(path: str, run: Run, label: str, skip: frozenset[str] = frozenset(),
               workers: int | None = None) -> None:
    """Append the spans of one spans.jsonl (a run recorded before the event log), imported
    as the loader's rows (``otlp_import``); spans of requests in ``skip`` (warm-up) are not
    kept."""
    from omnitrace.analyze import otlp_import
    imp = otlp_import.read(path, label, frozenset(skip), workers)
    run.warnings.extend(imp.warnings)
    if imp.malformed and not imp.spans + imp.skipped:
        raise RunDirError(f"{label}: none of its {imp.lines} line(s) is an OTLP/JSON "
                          "ExportTraceServiceRequest ({\"resourceSpans\": [...]})")
    acc = tables.ReportTables()  # warm-up spans were left out by the import
    acc.feed(imp.feed, imp.part)
    run.span_lines += imp.lines
    run.skipped_spans += imp.skipped
    run.span_count += imp.spans
    _add_tables(run, acc, imp.part.requests, imp.part.rings, imp.replica_of)
    if imp.malformed:
        run.warnings.append(f"{label}: {imp.malformed} malformed line(s)/span(s) skipped")


def _add_tables(run: Run, acc: tables.ReportTables, requests: list[str], rings: dict[int, dict],
                replica_of: dict[int, int]) -> None:
    """A loaded run directory's tables into ``run``: request, stage and queue spans as
    objects, the chunk rows, figures and busy intervals as tables."""
    small, early, emits, figures, busy = acc.finish(replica_of)
    run.spans.extend(spans_from_table(small, emits, requests, rings))  # chunk spans: with_chunks
    add_chunks(run, figures, early, busy, requests)


def _chunk_span(row: tuple, requests: list[str]) -> Span:
    """One chunk span row (a ``spantable.SPAN_DTYPE`` row as a tuple) -> :class:`Span`."""
    (name, reason, _error, _status, stage, peer, replica, req, chunk, _ring, start, end, v1, v2,
     _t1, _t2, by0, by1, by2) = row
    if name == stt.N_FIFO:
        by = tuple(requests[x] for x in (by0, by1, by2) if x)
        return Span(stt.NAMES[name], requests[req], stage, peer, chunk, start, end, replica, v2, by,
                    v1 + 1, v1, 0, reason != 0)
    nb = v1 if name in (stt.N_PUT, stt.N_PROCESS, stt.N_GET) else 0
    return Span(stt.NAMES[name], requests[req], stage, peer, chunk, start, end, replica, 0, (),
                -1, -1, nb, reason != 0)


def chunk_spans(rows: np.ndarray, requests: list[str]) -> list[Span]:
    """Chunk span rows -> :class:`Span` objects, in row order."""
    return [_chunk_span(row, requests) for row in rows.tolist()]


def _emit_firsts(emits: np.ndarray) -> dict[tuple[int, int, int], tuple[int | None, int | None]]:
    """(request, stage, replica) -> the first audio and the first ``omni.emit`` time of the
    events ``otlp.emit_events`` gives that stage span (API marks are not emits), by one sort
    of the emit rows: ``attribution.first_audio_emit`` otherwise looks at every packet's
    attributes (~40 per request before its first audio packet)."""
    e = rowops.select(emits, emits["modality"] != -1)
    if not len(e):
        return {}
    o = np.lexsort((e["replica"], e["stage"], e["req"]))
    req, stage, rep, t = e["req"][o], e["stage"][o], e["replica"][o], e["t"][o]
    head = np.ones(len(o), bool)
    head[1:] = (req[1:] != req[:-1]) | (stage[1:] != stage[:-1]) | (rep[1:] != rep[:-1])
    lo = np.flatnonzero(head)
    never = np.iinfo(np.int64).max
    audio = np.minimum.reduceat(np.where(e["modality"][o] == int(cv.Modality.AUDIO), t, never), lo)
    first = np.minimum.reduceat(t, lo)
    return {(r, s, p): (a if a != never else None, f) for r, s, p, a, f in zip(
        req[lo].tolist(), stage[lo].tolist(), rep[lo].tolist(), audio.tolist(), first.tolist())}


def spans_from_table(table, emits, requests: list[str], rings: dict[int, dict],
                     chunks_before_ttfp: bool = False, emit_events_too: bool = True) -> list[Span]:
    """Span-table rows (``omnitrace.spantable``) -> report :class:`Span` objects; with
    ``chunks_before_ttfp`` only chunk spans that began before their request's first audio
    packet (all attribution can walk) become objects. Without ``emit_events_too`` stage
    spans carry no ``omni.emit`` events (the walk reads only their first emits, kept)."""
    from omnitrace.otlp import emit_events, request_attrs, stage_attrs
    names = stt.NAMES
    by_stage = emit_events(emits if emit_events_too else emits[emits["modality"] == -1])
    firsts = _emit_firsts(emits)
    keep = np.ones(len(table), bool)
    if chunks_before_ttfp:
        roots = table[table["name"] == stt.N_REQUEST]
        ttfp = np.zeros(len(requests), np.int64)
        ttfp[roots["req"].astype(np.int64)] = np.where(roots["t2"] > 0, roots["t2"], 0)
        chunk = table["name"] >= stt.N_SNAPSHOT
        keep &= ~chunk | (table["start"] <= ttfp[table["req"].astype(np.int64)])
    out: list[Span] = []
    append = out.append
    for row in rowops.select(table, keep).tolist():
        if row[0] >= stt.N_SNAPSHOT:  # chunk spans: the hot part
            append(_chunk_span(row, requests))
            continue
        (name, reason, error, status, stage, peer, replica, req, chunk, ring, start, end, v1, v2,
         t1, t2, by0, by1, by2) = row
        rid = requests[req]
        if name == stt.N_REQUEST:
            attrs = request_attrs(rid, status, replica, v1, v2)
            events = []
            if t1:
                events.append((cv.EVENT_TTFT, t1, {}))
            if t2:
                events.append((cv.EVENT_TTFP, t2, {}))
            events.extend(by_stage.get((req, cv.API_STAGE, replica), ()))  # API marks
            append(Span(names[name], rid, cv.API_STAGE, -2, -1, start, end, replica,
                        incomplete=reason != 0, events=events, attrs=attrs))
        else:
            # an imported span that named no stage has no ring
            attrs = stage_attrs(rid, stage, (rings.get(ring, {}).get("process") or f"stage{stage}")
                                if ring >= 0 else None, replica)
            events = by_stage.get((req, stage, replica), []) if name == stt.N_STAGE else []
            sp = Span(names[name], rid, stage, -2, -1, start, end, replica,
                      incomplete=reason != 0, events=events, attrs=attrs)
            if name == stt.N_STAGE:
                sp.emit_firsts = firsts.get((req, stage, replica), (None, None))
            append(sp)
    return out


# the walk's three indexes of a request's chunk spans (``attribution.RequestSpans``)
_PRODUCER, _CONSUMER, _SCHEDULED = range(3)
_PRODUCER_CODES = np.array(stt.PRODUCER_NAMES)
_CONSUMER_CODES = np.array(stt.CONSUMER_NAMES)


def _key_code(a: int, b: int, chunk: int) -> int:
    """(stage, stage, chunk) -> one int < 2^64: an index key (:func:`_key_codes` alike)."""
    return ((a + 32768) << 48) | ((b + 32768) << 32) | (chunk + (1 << 31))


def _key_codes(a: np.ndarray, b: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """:func:`_key_code` of int16/int16/int32 columns (uint64: no sign bit to wrap into)."""
    u = np.uint64
    return (((a.astype(np.int64) + 32768).astype(u) << u(48)) | ((b.astype(np.int64) + 32768).astype(u) << u(32))
            | (chunk.astype(np.int64) + (1 << 31)).astype(u))


class _BatchChunks:
    """The chunk span rows of a batch of requests (each request's rows contiguous, in table
    order), indexed by the keys ``attribution.index_requests`` uses: per (request, index)
    its keys sorted, a key's rows in table order. One lexsort per batch, not a Python step
    per row: the walk reads a few hops of a request's ~100 chunk spans before its first
    packet, and an hour's run has millions of them; Span objects are made only for the keys
    the walk asks for (:class:`_LazyChunks`)."""

    __slots__ = ("rows", "requests", "keys", "bounds")

    def __init__(self, rows: np.ndarray, counts: np.ndarray, requests: list[str]) -> None:
        self.requests = requests
        owner = np.repeat(np.arange(len(counts)), counts)
        name, stage, peer, chunk = rows["name"], rows["stage"], rows["peer"], rows["chunk"]
        # incomplete wait_schedule spans are left out, as index_requests leaves them
        ready = (name == stt.N_WAIT) & (rows["reason"] == 0)
        cons = np.isin(name, _CONSUMER_CODES) & ((name != stt.N_WAIT) | ready)
        parts = [(np.flatnonzero(sel), key) for sel, key in (
            (np.isin(name, _PRODUCER_CODES), _key_codes(stage, peer, chunk)),
            (cons, _key_codes(peer, stage, chunk)),
            (ready, stage.astype(np.uint64)))]
        rowno = np.concatenate([at for at, _ in parts])
        key = np.concatenate([k[at] for at, k in parts])
        group = owner[rowno] * 3 + np.repeat(np.arange(3), [len(at) for at, _ in parts])
        order = np.lexsort((key, group))  # stable: a key's rows stay in table order
        # the rows in index order (a ready wait_schedule row twice: consumer and scheduled
        # index): a key's rows are a slice, no gather per lookup
        self.keys, self.rows = key[order].tolist(), rowops.take(rows, rowno[order])
        self.bounds = np.searchsorted(group[order], np.arange(3 * len(counts) + 1)).tolist()

    def spans(self, request: int, which: int, code: int) -> list[Span]:
        """Span objects of the rows of ``request`` (its place in the batch) under key
        ``code`` of index ``which``, in table order."""
        lo, hi = self.bounds[3 * request + which], self.bounds[3 * request + which + 1]
        a = bisect.bisect_left(self.keys, code, lo, hi)
        b = bisect.bisect_right(self.keys, code, a, hi)
        if a == b:
            return []
        requests = self.requests
        return [_chunk_span(row, requests) for row in self.rows[a:b].tolist()]


class _LazyChunks:
    """``attribution.RequestSpans.producer`` / ``consumer`` / ``scheduled`` (``which``) of
    one request of a :class:`_BatchChunks`: ``get`` makes the Span objects of one key."""

    __slots__ = ("batch", "request", "which", "cache")

    def __init__(self, batch: _BatchChunks, request: int, which: int) -> None:
        self.batch, self.request, self.which = batch, request, which
        self.cache: dict = {}

    def get(self, key: Any, default: Any = None) -> Any:
        hit = self.cache.get(key)
        if hit is None:
            code = key if self.which == _SCHEDULED else _key_code(*key)
            spans = self.batch.spans(self.request, self.which, code)
            if self.which == _SCHEDULED:
                hit = spans
            else:
                hit = {}
                for sp in spans:
                    hit.setdefault(sp.name, []).append(sp)
            self.cache[key] = hit
        return hit if hit else default


def chunk_rows(run: Run, rids: list[str], batch: int) -> Iterator[tuple[list[str], np.ndarray, np.ndarray]]:
    """``rids`` in batches of ``batch``: (the batch, its requests' rows of ``run.early``,
    each request in turn with its rows in table order, and the rows per request)."""
    early = run.early if run.early is not None else np.zeros(0, stt.SPAN_DTYPE)
    order = np.argsort(early["req"], kind="stable")  # a request's rows stay in table order
    sreq = early["req"][order]
    cidx = run.chunk_index()
    for k in range(0, len(rids), batch):
        part = rids[k:k + batch]
        ids = np.array([cidx.get(r, -1) for r in part], np.int64)
        lo, hi = np.searchsorted(sreq, ids, "left"), np.searchsorted(sreq, ids, "right")
        counts = np.where(ids >= 0, hi - lo, 0)
        _, pos = stt.expand_ranges(lo, lo + counts)
        yield part, rowops.take(early, order[pos]), counts


def with_chunks(run: Run, reqs: dict, rids: list[str], batch: int = 2048) -> Iterator:
    """Each of ``rids``' ``attribution.RequestSpans`` (from ``reqs``) with its chunk spans
    attached (lazily, from ``run.early``), in batches of ``batch`` requests; a batch's rows
    are dropped when the next one is taken."""
    for part, rows, counts in chunk_rows(run, rids, batch):
        yield from attach_chunks(run, reqs, part, rows, counts)


def attach_chunks(run: Run, reqs: dict, part: list[str], rows: np.ndarray, counts: np.ndarray
                  ) -> Iterator:
    """A :func:`chunk_rows` batch's ``attribution.RequestSpans`` with their chunk spans
    attached (lazily), dropped again once the batch is walked."""
    chunks = _BatchChunks(rows, counts, run.chunk_requests)
    for i, (rid, n) in enumerate(zip(part, counts.tolist())):
        if n:
            r = reqs[rid]
            r.producer, r.consumer, r.scheduled = (_LazyChunks(chunks, i, w)
                                                   for w in (_PRODUCER, _CONSUMER, _SCHEDULED))
    for rid in part:
        yield reqs[rid]
    for rid in part:
        reqs[rid].drop_chunks()


def request_spans(run: Run) -> dict:
    """Every request's ``attribution.RequestSpans`` with all its chunk spans as objects
    (the whole run: for small runs and tests; the report walks ``with_chunks``)."""
    from omnitrace.analyze import attribution as at
    reqs = at.index_requests(run.spans)
    early = run.early if run.early is not None else np.zeros(0, stt.SPAN_DTYPE)
    known = np.array([r in reqs for r in run.chunk_requests], bool)
    rows = rowops.select(early, known[early["req"].astype(np.int64)])
    at.index_requests(chunk_spans(rows, run.chunk_requests), reqs)
    return reqs


def add_chunks(run: Run, figures: tables.ChunkFigures, early, busy: dict,
               requests: list[str]) -> None:
    """Append a run directory's figure tables, early chunk rows (``spantable.SPAN_DTYPE``)
    and senders' busy intervals to ``run.figures`` / ``run.early`` / ``run.busy``, their
    request ids re-numbered into ``run.chunk_requests`` (several run directories merge into
    one table; a (stage, replica) present in two keeps one timeline)."""
    index = {r: i for i, r in enumerate(run.chunk_requests)}
    remap = np.zeros(len(requests), np.uint32)
    for i, r in enumerate(requests):
        j = index.get(r)
        if j is None:
            j = index[r] = len(run.chunk_requests)
            run.chunk_requests.append(r)
        remap[i] = j
    if not np.array_equal(remap, np.arange(len(requests))):  # the first run: ids unchanged
        for col in ("req", "by0", "by1", "by2"):
            early[col] = remap[early[col].astype(np.int64)]
        figures = figures.renumbered(remap, len(run.chunk_requests))
        busy = {k: (s, e, remap[r.astype(np.int64)]) for k, (s, e, r) in busy.items()}
    run.figures = figures if run.figures is None else run.figures.merged(figures)
    run.early = early if run.early is None else rowops.concat((run.early, early), early.dtype)
    run.busy = headofline.merged_busy(run.busy, busy) if run.busy else busy


def load_events(path: str, run: Run, label: str, skip: frozenset[str] = frozenset(),
                run_json: dict[str, Any] | None = None, agent: dict[str, Any] | None = None) -> bool:
    """Append the spans built from one run directory's event log, and its accounting
    (from ``run_json`` and ``agent``, the directory's files); False if it has no log."""
    from omnitrace import eventlog, spanload
    from omnitrace.analyze import accounting, tables
    acc = tables.ReportTables(skip)
    try:
        built = spanload.load(path, [acc])
    except eventlog.EventLogError as exc:
        raise RunDirError(str(exc)) from None
    if built is None:
        return False
    log = built.log
    run.events += built.events
    live = bool(run_json) and run_json.get("status") == "running" and live_agent(path) is not None
    torn = log.torn_segments
    if live and log.last_torn:  # a live agent's segment is open, not torn
        torn -= 1
        last = os.path.basename(eventlog.segments(path)[-1])
        log.warnings = [w for w in log.warnings if not w.startswith(f"events/{last}:")]
    run.warnings.extend(f"{label}{w}" for w in log.warnings)
    run.warnings.extend(label + w for w in _mixed(log.run_ids, run_json))
    run.torn_records += log.torn_records
    led = accounting.ledger(built.events, log.rings, log.accounts, torn > 0, agent, run_json)
    led.live = live
    run.ledger = led if run.ledger is None else run.ledger.merged(led)
    run.stage_deaths.extend(sorted(built.died, key=lambda x: x[1]))
    run.skipped_spans += acc.skipped
    run.span_count += acc.rows - acc.skipped
    _add_tables(run, acc, log.requests.strings, log.rings,
                {int(r.get("pid", 0)): int(r.get("replica", 0)) for r in log.rings.values()})
    return True


def _mixed(log_ids: set[str], run_json: dict[str, Any] | None) -> list[str]:
    """Files of two runs in one directory: the event log's run ids against run.json's."""
    rid = str((run_json or {}).get("run_id") or "")
    if len(log_ids) > 1:
        return [f"events/ holds segments of {len(log_ids)} runs ({', '.join(sorted(log_ids))}): "
                "two runs are mixed in this directory"]
    if rid and log_ids and rid not in log_ids:
        return [f"events/ belongs to run {next(iter(log_ids))}, run.json to run {rid}: two runs "
                "are mixed in this directory"]
    return []


def _bench_outside(bench: dict[str, Any] | None, run_json: list[dict[str, Any]]) -> str | None:
    """bench.json of another run: most of its requests were sent while no run was on."""
    spans = [(int(r.get("started_unix_ns") or 0), int(r.get("ended_unix_ns") or 0) or 1 << 62)
             for r in run_json if isinstance(r.get("started_unix_ns"), int)]
    starts = [int(q["start_unix_ns"]) for q in (bench or {}).get("requests") or ()
              if isinstance(q, dict) and isinstance(q.get("start_unix_ns"), int)]
    if not spans or not starts:
        return None
    outside = sum(1 for t in starts if not any(a <= t <= b for a, b in spans))
    if outside * 2 <= len(starts):
        return None
    return (f"bench.json does not belong to this run: {outside} of its {len(starts)} requests "
            "were sent while the run was not on (a bench file of another run?)")


def _check_types(name: str, doc: dict[str, Any] | None, pre: str) -> None:
    """A field the report reads, of the wrong type: one line now, not a traceback later."""
    why = fieldtypes.check(name, doc) if doc is not None else None
    if why:
        raise RunDirError(f"{pre}{name}: {why} (not a file omnitrace writes)")


def _bench_shape_error(bench: dict[str, Any]) -> str | None:
    for key in ("levels", "requests"):
        v = bench.get(key)
        if v is None:
            continue
        if not isinstance(v, list):
            return f"{key!r} is {type(v).__name__}, not a list"
        if not all(isinstance(x, dict) for x in v):
            return f"{key!r} holds a non-object"
    return None


def _warmup_ids(bench: dict[str, Any] | None) -> set[str]:
    """Warm-up request ids from bench.json: their spans are never needed (saves time)."""
    if not bench:
        return set()
    return {str(r["id"]) for r in bench.get("requests") or () if isinstance(r, dict) and r.get("warmup")
            and r.get("id")}


def load_run(paths: list[str], skip_warmup: bool = True) -> Run:
    """Load and merge run directories (e.g. one per host of one deployment)."""
    # Millions of small acyclic objects: the cyclic GC would rescan them again and again
    # (superlinear time); nothing here makes cycles, so it is paused while loading.
    was = gc.isenabled()
    gc.disable()
    try:
        return _load_run(paths, skip_warmup)
    finally:
        if was:
            gc.enable()


def _load_run(paths: list[str], skip_warmup: bool) -> Run:
    run = Run(paths=list(paths))
    files: dict[str, tuple[dict | None, dict | None]] = {}  # path -> (run.json, agent.json)
    if not paths:
        raise RunDirError("no run directory given")
    for p in paths:
        if not os.path.isdir(p):
            raise RunDirError(f"{p}: not a run directory (does not exist or is not a directory)")
        label = os.path.basename(os.path.normpath(p)) if len(paths) > 1 else ""
        pre = f"{label}/" if label else ""
        rj = _load_json(os.path.join(p, "run.json"), pre + "run.json", run.warnings)
        _check_types("run.json", rj, pre)
        if rj is None:
            run.warnings.append(f"{pre}run.json missing: run metadata unknown (agent killed before writing it?)")
        else:
            run.run_json.append(rj)
            if rj.get("status") not in (None, "complete"):
                run.warnings.append(f"{pre}run status is {rj.get('status')!r}: the run did not finish "
                                    "cleanly; results are partial")
            left = rj.get("shm_leftovers")
            if isinstance(left, dict) and (left.get("wake_dirs") or left.get("chunk_segments")):
                run.warnings.append(
                    f"{pre}the served processes left /dev/shm entries, removed after the run: "
                    f"{len(left.get('wake_dirs') or ())} stale vLLM-Omni wake director(ies) of exited "
                    f"stages, {len(left.get('chunk_segments') or ())} chunk segment(s) never read "
                    "(a stage died mid-request?)")
            if isinstance(left, dict) and left.get("chunk_segments_kept"):
                run.warnings.append(
                    f"{pre}{len(left['chunk_segments_kept'])} chunk segment(s) never read were left "
                    f"in /dev/shm: process(es) {left.get('alive_pids')} of the run outlived it")
        aj = _load_json(os.path.join(p, "agent.json"), pre + "agent.json", run.warnings)
        _check_types("agent.json", aj, pre)
        if aj is None:
            run.warnings.append(f"{pre}agent.json missing: recorder counters (events, drops) unknown")
        else:
            run.agent.append(aj)
        bj = _load_json(os.path.join(p, "bench.json"), pre + "bench.json", run.warnings)
        if bj is not None:
            why = _bench_shape_error(bj)
            if why:
                raise RunDirError(f"{pre}bench.json: not an omnitrace bench file ({why})")
            _check_types("bench.json", bj, pre)
        if bj is not None and run.bench is None:
            run.bench = bj
        files[p] = (rj, aj)
        pj = os.path.join(p, "processes.jsonl")
        if os.path.exists(pj):
            for _, line in _read_lines(pj, pre + "processes.jsonl", run.warnings):
                try:
                    run.processes.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    pass
        from omnitrace.profile.finalize import warnings_for  # --flame runs: missing profiles
        run.warnings.extend(pre + w for w in warnings_for(p))
    why = _bench_outside(run.bench, run.run_json)
    if why:
        run.warnings.append(why)
    skip = frozenset(_warmup_ids(run.bench) if skip_warmup else ())
    for p in paths:
        label = os.path.basename(os.path.normpath(p)) if len(paths) > 1 else ""
        pre = f"{label}/" if label else ""
        if load_events(p, run, pre, skip, *files.get(p, (None, None))):
            continue
        sp = os.path.join(p, "spans.jsonl")  # a run recorded before the event log
        if not os.path.exists(sp):
            run.warnings.append(f"{pre}events/ missing: no events recorded")
        else:
            load_spans(sp, run, pre + "spans.jsonl", skip)
    if not run.spans and not run.bench and not run.run_json and not run.agent:
        raise RunDirError(f"{', '.join(paths)}: no omnitrace run files found (run.json, events/, "
                          "bench.json, agent.json all missing or unreadable)")
    return run
