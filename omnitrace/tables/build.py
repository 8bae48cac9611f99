"""The tables of one run directory, made by a sink of the one loader (``spanload``).

:class:`TablesSink` takes each feed's spans as the span builder makes them and keeps, per
kind, only the columns its tables have (a narrow row per chunk span); :meth:`TablesSink.finish`
turns them into the Arrow tables ``schema.TABLES`` declares. The chunk spans' ``figure``
column (``spantable.CHUNK_DTYPE``: a strategy, tasks ahead or bytes, by span name) stops
here: every table column has one meaning.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pyarrow as pa

from omnitrace import conventions as cv
from omnitrace import keys, rowops, spanload
from omnitrace import spantable as stt
from omnitrace.rowops import Growing
from omnitrace.tables.schema import TABLES, arrow_table

# chunk tables: (span name, recorded by the producer, column names of start, end, duration,
# and of the span's own figure: its strategy, tasks ahead or bytes (None: it has none))
CHUNK_TABLES = {
    "snapshots": (stt.N_SNAPSHOT, True, ("start_ns", "end_ns", "dur_ns"), "strategy"),
    "fifo_tasks": (stt.N_FIFO, True, ("enqueue_ns", "dequeue_ns", "residence_ns"), "ahead"),
    "payloads": (stt.N_PROCESS, True, ("start_ns", "end_ns", "dur_ns"), "bytes"),
    "puts": (stt.N_PUT, True, ("start_ns", "end_ns", "dur_ns"), "bytes"),
    "gets": (stt.N_GET, False, ("start_ns", "end_ns", "dur_ns"), "bytes"),
    "waits": (stt.N_WAIT, False, ("ready_ns", "scheduled_ns", "wait_ns"), None),
    "poll_lags": (stt.N_POLL, False, ("put_end_ns", "get_begin_ns", "lag_ns"), None),
}
# a chunk span as kept: the chunk row's columns the tables read, and its process
KEPT_CHUNK_DTYPE = np.dtype([("req", "<u4"), ("stage", "<i2"), ("peer", "<i2"), ("replica", "<i2"),
                             ("chunk", "<i4"), ("ring", "<i4"), ("pid", "<i8"), ("start", "<i8"),
                             ("end", "<i8"), ("figure", "<i8"), ("blocked", "<i8"), ("reason", "i1"),
                             ("by0", "<u4"), ("by1", "<u4"), ("by2", "<u4")])
BUSY_DTYPE = np.dtype([("pid", "<i8"), ("stage", "<i2"), ("req", "<u4"), ("start", "<i8"), ("end", "<i8")])
# the tables that hold sender_id
SENDER_ID_TABLES = frozenset(n for n, t in TABLES.items() if any(c.name == "sender_id" for c in t.columns))
LOADED = frozenset(n for n, t in TABLES.items() if t.source == "load")
STATUS = tuple(s.name.lower() for s in cv.Status)
MODALITY = tuple(m.name.lower() for m in cv.Modality)
SNAPSHOT = tuple(s.name.lower() for s in cv.Snapshot)
MARKS = tuple(cv.API_MARKS.values())
_MARK_CODE = {k: i for i, k in enumerate(cv.API_MARKS)}


class TablesSink:
    """The tables' sink of the one load (``spanload.Sink``). ``wanted``: the tables to
    make (None: all of them); a chunk table not wanted keeps nothing."""

    steps = False

    def __init__(self, wanted: Iterable[str] | None = None) -> None:
        self.wanted = LOADED if wanted is None else LOADED & set(wanted)
        # blocked_by costs the builder a ranking of every overlap: only when it is read
        self.culprits = "fifo_tasks" in self.wanted
        # the chunk stamps are most of a load's work: paired only when a table reads them
        self.chunks = bool(self.wanted & (set(CHUNK_TABLES) | SENDER_ID_TABLES))
        self._chunks = {n: Growing(KEPT_CHUNK_DTYPE) for n in CHUNK_TABLES if n in self.wanted}
        self._requests = Growing(stt.REQUEST_DTYPE)
        self._visits = Growing(stt.VISIT_DTYPE)
        # the emit rows where the emits table is wanted; else the API marks only, and each
        # feed's packets per visit (a few rows per visit, not one per packet)
        self._emits = Growing(stt.EMIT_DTYPE)
        self._visit_emits: list[stt.VisitEmits] = []
        # the sender tasks, where a table numbers the senders (they are numbered over the
        # tasks and the FIFO tasks: one numbering whichever of those tables a load makes)
        self._busy = Growing(BUSY_DTYPE) if self.wanted & SENDER_ID_TABLES else None

    def feed(self, feed: stt.Feed, part: spanload.Part) -> None:
        spans = feed.spans
        self._requests.append(spans.requests)
        self._visits.append(spans.visits)
        emits = spans.emits
        if "emits" in self.wanted:
            self._emits.append(emits)
        else:
            self._emits.append(rowops.select(emits, emits["stage"] == cv.API_STAGE))  # marks_table's
            if "stage_visits" in self.wanted:
                self._visit_emits.append(stt.VisitEmits.of(emits))
        chunks = spans.chunks
        if self._chunks:
            top = max(int(chunks["ring"].max()) + 1 if len(chunks) else 0, max(part.rings, default=-1) + 1)
            pids = stt.ring_column(part.rings, top, "pid")
            for table, grow in self._chunks.items():
                grow.append(_chunk_rows(rowops.select(chunks, chunks["name"] == CHUNK_TABLES[table][0]), pids))
        if self._busy is not None:
            for pid, stage, starts, ends, reqs in feed.busy:
                rows = np.empty(len(starts), BUSY_DTYPE)
                rows["pid"], rows["stage"], rows["req"], rows["start"], rows["end"] = pid, stage, reqs, starts, ends
                self._busy.append(rows)

    def finish(self, rings: dict[int, dict], requests: list[str]) -> dict[str, pa.Table]:
        """The wanted tables; ``rings``: the final ring descriptions, ``requests``: request id
        strings by number (the log's, then any only the bench sent)."""
        senders = self._senders(rings)
        made = {
            "requests": lambda: requests_table(self._requests.view(), requests),
            "stage_visits": lambda: visits_table(self._visits.view(), self._packets()),
            "emits": lambda: emits_table(self._emits.view()),
            "api_marks": lambda: marks_table(self._emits.view()),
            "senders": lambda: senders.table(),
            "sender_tasks": lambda: senders.tasks(),
            "processes": lambda: processes_table(rings),
            "threads": lambda: threads_table(rings),
            "stages": lambda: stages_table(rings),
        }
        for table, grow in self._chunks.items():
            made[table] = lambda t=table, g=grow: chunk_table(t, g.view(), senders)
        return {n: made[n]() for n in TABLES if n in self.wanted}

    def _senders(self, rings: dict[int, dict]) -> "_Senders | None":
        if self._busy is None:
            return None
        fifo = self._chunks.get("fifo_tasks")
        return _Senders(self._busy.view(), fifo.view() if fifo is not None else np.zeros(0, KEPT_CHUNK_DTYPE),
                        spanload.replica_of(rings))

    def _packets(self) -> stt.VisitEmits:
        """Each visit's packets, from every emit or from each feed's."""
        if "emits" in self.wanted:
            return stt.VisitEmits.of(self._emits.view())
        return stt.VisitEmits.concat(self._visit_emits).grouped()


def _chunk_rows(spans: np.ndarray, pids: np.ndarray) -> np.ndarray:
    rows = np.empty(len(spans), KEPT_CHUNK_DTYPE)
    for f in KEPT_CHUNK_DTYPE.names:
        if f != "pid":
            rows[f] = spans[f]
    rows["pid"] = pids[spans["ring"]]
    return rows


# ---------------------------------------------------------------- columns
def _nullable(values: np.ndarray, null: np.ndarray) -> pa.Array:
    return pa.array(np.asarray(values, np.int64), pa.int64(), mask=np.asarray(null, bool))


def enum(codes: np.ndarray, names: tuple[str, ...], null: np.ndarray | None = None) -> pa.Array:
    """``codes`` (indexes into ``names``) as a dictionary-encoded string column."""
    codes = np.asarray(codes).astype(np.int8)
    mask = None if null is None else np.asarray(null, bool)
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int8(), mask=mask), pa.array(names, pa.string()))


def incomplete(reason: np.ndarray) -> pa.Array:
    return enum(reason, stt.REASONS, reason == stt.R_NONE)


def request_list(cols: list[np.ndarray]) -> pa.Array:
    """Per row, its non-zero request ids of ``cols`` (the ranked by0..by2), as a list."""
    by = np.stack(cols, axis=1).astype(np.int64)
    have = by != 0
    offsets = np.concatenate(([0], np.cumsum(have.sum(axis=1)))).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(by[have], pa.int64()))


# ---------------------------------------------------------------- tables
def requests_table(rows: np.ndarray, requests: list[str]) -> pa.Table:
    """One row per request id 1..n-1 of ``requests``; the request span's columns where it
    has one."""
    n = len(requests) - 1
    at = np.full(len(requests), -1, np.int64)
    at[rows["req"].astype(np.int64)] = np.arange(len(rows))
    at = at[1:]
    has = at >= 0
    r = rowops.take(rows, np.maximum(at, 0)) if len(rows) else np.zeros(n, stt.REQUEST_DTYPE)
    done = has & (r["reason"] == stt.R_NONE)
    arrival = np.where(has, r["start"], 0)

    def since_arrival(t: np.ndarray) -> pa.Array:
        return _nullable(t - arrival, ~has | (t == 0))

    return arrow_table("requests", {
        "request_id": np.arange(1, n + 1), "request": pa.array(requests[1:], pa.string()),
        "replica": pa.array(r["replica"].astype(np.int32), mask=~has),
        "thread_id": _nullable(r["ring"], ~has), "arrival_ns": _nullable(arrival, ~has),
        "first_text_ns": _nullable(r["first_text"], ~has | (r["first_text"] == 0)),
        "first_audio_ns": _nullable(r["first_audio"], ~has | (r["first_audio"] == 0)),
        "end_ns": _nullable(r["end"], ~done), "last_ns": _nullable(r["end"], ~has),
        "ttft_ns": since_arrival(r["first_text"]), "ttfp_ns": since_arrival(r["first_audio"]),
        "status": enum(np.clip(r["status"], 0, len(STATUS) - 1), STATUS, ~done),
        "prompt_tokens": _nullable(r["prompt_tokens"], ~has | (r["prompt_tokens"] < 0)),
        "max_tokens": _nullable(r["max_tokens"], ~has | (r["max_tokens"] < 0)),
        "incomplete": enum(r["reason"], stt.REASONS, ~has | (r["reason"] == stt.R_NONE))})


def visits_table(visits: np.ndarray, v: stt.VisitEmits) -> pa.Table:
    """One row per (request, stage, replica) with a stage or queue span; ``v``: the visits'
    packets."""
    st = rowops.select(visits, visits["name"] == stt.N_STAGE)
    qu = rowops.select(visits, visits["name"] == stt.N_QUEUE)
    sk, qk = (keys.visit_key(x["req"], x["stage"], x["replica"]) for x in (st, qu))
    uniq, _ = keys.dense(np.concatenate((sk, qk)))
    n = len(uniq)
    req, stage, replica = keys.unpack(uniq, keys.VISIT_BITS)
    si, qi = np.full(n, -1), np.full(n, -1)
    si[np.searchsorted(uniq, sk)] = np.arange(len(st))
    qi[np.searchsorted(uniq, qk)] = np.arange(len(qu))
    s = rowops.take(st, np.maximum(si, 0)) if len(st) else np.zeros(n, stt.VISIT_DTYPE)
    q = rowops.take(qu, np.maximum(qi, 0)) if len(qu) else np.zeros(n, stt.VISIT_DTYPE)
    has_s, has_q = si >= 0, qi >= 0
    finished = has_s & (s["reason"] == stt.R_NONE)
    vk = keys.visit_key(v.req, v.stage, v.replica)
    at = np.minimum(np.searchsorted(uniq, vk), max(n - 1, 0))
    ok = uniq[at] == vk if n else np.zeros(len(vk), bool)  # a visit's emits without its span: none
    first, first_audio, count = np.full(n, stt.NO_EMIT), np.full(n, stt.NO_EMIT), np.zeros(n, np.int64)
    first[at[ok]], first_audio[at[ok]], count[at[ok]] = v.first[ok], v.first_audio[ok], v.count[ok]
    return arrow_table("stage_visits", {
        "request_id": req, "stage": stage.astype(np.int32), "replica": replica.astype(np.int32),
        "thread_id": np.where(has_s, s["ring"], q["ring"]), "add_ns": np.where(has_s, s["start"], q["start"]),
        "schedule_ns": _nullable(q["end"], ~has_q | (q["reason"] != stt.R_NONE)),
        "finish_ns": _nullable(s["end"], ~finished), "last_ns": _nullable(s["end"], ~has_s),
        "status": _nullable(s["status"], ~finished),
        "first_emit_ns": _nullable(first, first == stt.NO_EMIT),
        "first_audio_emit_ns": _nullable(first_audio, first_audio == stt.NO_EMIT),
        "emits": count, "incomplete": incomplete(np.where(has_s, s["reason"], q["reason"]))})


def emits_table(emits: np.ndarray) -> pa.Table:
    e = rowops.select(emits, emits["stage"] != cv.API_STAGE)
    return arrow_table("emits", {
        "request_id": e["req"].astype(np.int64), "stage": e["stage"].astype(np.int32),
        "replica": e["replica"].astype(np.int32), "t_ns": e["t"], "packet": e["packet"],
        "modality": enum(np.clip(e["modality"], 0, len(MODALITY) - 1), MODALITY,
                         (e["modality"] < 0) | (e["modality"] >= len(MODALITY)))})


def marks_table(emits: np.ndarray) -> pa.Table:
    """The API marks: the builder hands them as emit rows of stage API_STAGE (packet = the
    mark's event kind)."""
    e = rowops.select(emits, emits["stage"] == cv.API_STAGE)
    code = np.array([_MARK_CODE.get(k, 0) for k in e["packet"].tolist()], np.int8)
    return arrow_table("api_marks", {"request_id": e["req"].astype(np.int64), "t_ns": e["t"],
                                     "mark": enum(code, MARKS)})


def chunk_table(table: str, rows: np.ndarray, senders: "_Senders") -> pa.Table:
    _, producer_side, (start, end, dur), figure = CHUNK_TABLES[table]
    stage, peer = rows["stage"].astype(np.int32), rows["peer"].astype(np.int32)
    bad = rows["reason"] != stt.R_NONE
    cols: dict[str, object] = {
        "request_id": rows["req"].astype(np.int64),
        "producer_stage": stage if producer_side else peer, "consumer_stage": peer if producer_side else stage,
        "chunk": rows["chunk"], "replica": rows["replica"].astype(np.int32), "thread_id": rows["ring"].astype(np.int64),
        start: rows["start"], end: rows["end"], dur: rows["end"] - rows["start"]}
    if table != "poll_lags":
        cols["incomplete"] = incomplete(rows["reason"])
    if figure == "strategy":
        cols[figure] = enum(np.clip(rows[stt.STRATEGY], 0, len(SNAPSHOT) - 1), SNAPSHOT, bad)
    elif figure == "ahead":
        cols[figure] = pa.array(rows[stt.AHEAD].astype(np.int32), mask=bad)
    elif figure == "bytes":
        cols[figure] = pa.array(rows[stt.BYTES].astype(np.int64), mask=bad)
    if table == "fifo_tasks":
        cols["sender_id"] = senders.ids(rows["pid"], rows["stage"])
        cols["blocked_ns"] = _nullable(rows[stt.BLOCKED], bad)
        cols["blocked_by"] = request_list([rows["by0"], rows["by1"], rows["by2"]])
    return arrow_table(table, cols)


class _Senders:
    """The FIFO senders, one per (pid, stage) seen in a sender task or a FIFO task, numbered
    in (pid, stage) order."""

    def __init__(self, busy: np.ndarray, fifo: np.ndarray, replica_of: dict[int, int]) -> None:
        self.busy = busy
        self.keys, _ = keys.dense(np.concatenate((keys.sender_key(busy["pid"], busy["stage"]),
                                                  keys.sender_key(fifo["pid"], fifo["stage"]))))
        self.replica_of = replica_of

    def ids(self, pid: np.ndarray, stage: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.keys, keys.sender_key(pid, stage)).astype(np.int64)

    def table(self) -> pa.Table:
        pid, stage = keys.unpack(self.keys, keys.SENDER_BITS)
        return arrow_table("senders", {
            "sender_id": np.arange(len(self.keys)), "pid": pid, "stage": stage.astype(np.int32),
            "replica": np.array([self.replica_of.get(p, 0) for p in pid.tolist()], np.int32)})

    def tasks(self) -> pa.Table:
        b = self.busy
        order = np.lexsort((b["start"], self.ids(b["pid"], b["stage"])))
        b = rowops.take(b, order)
        return arrow_table("sender_tasks", {
            "sender_id": self.ids(b["pid"], b["stage"]), "request_id": b["req"].astype(np.int64),
            "start_ns": b["start"], "end_ns": b["end"], "dur_ns": b["end"] - b["start"]})


def processes_table(rings: dict[int, dict]) -> pa.Table:
    by_pid: dict[int, dict] = {}
    for _, r in sorted(rings.items()):
        by_pid.setdefault(int(r.get("pid", 0)), r)
    rows = sorted(by_pid.items())
    return arrow_table("processes", {
        "pid": [p for p, _ in rows], "role": [str(r.get("role", "")) for _, r in rows],
        "stage": [int(r.get("stage", cv.API_STAGE)) for _, r in rows],
        "replica": [int(r.get("replica", 0)) for _, r in rows],
        "name": [str(r.get("process", "")) for _, r in rows]})


def threads_table(rings: dict[int, dict]) -> pa.Table:
    rows = sorted(rings.items())
    return arrow_table("threads", {
        "thread_id": [i for i, _ in rows], "pid": [int(r.get("pid", 0)) for _, r in rows],
        "tid": [int(r.get("tid", 0)) for _, r in rows], "thread": [str(r.get("thread", "")) for _, r in rows],
        "role": [str(r.get("role", "")) for _, r in rows],
        "stage": [int(r.get("stage", cv.API_STAGE)) for _, r in rows],
        "replica": [int(r.get("replica", 0)) for _, r in rows]})


def stages_table(rings: dict[int, dict]) -> pa.Table:
    names = cv.stage_names(rings)
    return arrow_table("stages", {"stage": sorted(names), "name": [names[s] for s in sorted(names)]})
