"""Every table's columns, their Arrow types and what each one means: the one place they are
written down (``omnitrace sql RUN --tables`` prints them, docs/tables.md lists them and a
test holds the two equal, :func:`arrow_table` refuses columns that are not declared).

Conventions, as in Perfetto's trace processor: times are unix ns (``*_ns``; durations
``*_ns`` too), ids are int64 keys (``request_id`` into ``requests``, ``sender_id`` into
``senders``, ``thread_id`` into ``threads``), a missing value is null (never 0 or -1), and a
name from a small set (status, category, reason) is a dictionary-encoded string. Every
table's first column is ``run`` (into ``runs``): several run directories load as one set
of tables (``tables.combine``), their ids numbered on across them, so a join on an id is a
join within its run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset  # noqa: F401 - Table.filter imports it, and it hooks six into sys.meta_path: here, once

I32, I64, F64, STR, BOOL = pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_()
ENUM = pa.dictionary(pa.int8(), pa.string())
IDS = pa.list_(pa.int64())


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    source: str  # "load": the event log's one load; "bench": bench.json; "report": the report's walk

    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type) for c in self.columns])


RUN = Column("run", I32, "the run directory it came from (runs.run)")


def _cols(*spec: tuple[str, pa.DataType, str]) -> tuple[Column, ...]:
    return (RUN, *(Column(*s) for s in spec))


_REQ = ("request_id", I64, "the request (requests.request_id)")
_INCOMPLETE = ("incomplete", ENUM, "why the span has no end event: writer-died, run-ended, unfinished, "
                                   "timeout, consumer-never-scheduled; null: complete (the times of an "
                                   "incomplete span end at the request's last event)")


def _hop(recorder: str, thread: str) -> tuple[tuple[str, pa.DataType, str], ...]:
    """The columns every chunk table starts with: which chunk of which hop, recorded where."""
    return (_REQ,
            ("producer_stage", I32, "the stage that sent the chunk"),
            ("consumer_stage", I32, "the stage it was sent to"),
            ("chunk", I32, "the chunk's index within the request's producer -> consumer hop"),
            ("replica", I32, f"replica of the {recorder} stage"),
            ("thread_id", I64, f"the {thread} thread that recorded its first stamp (threads.thread_id)"))


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("requests", "One row per request the run knows: every request id of the event log and every "
          "bench.json request. The request id string is here only; every other table refers to "
          "request_id.", _cols(
              ("request_id", I64, "the run's number for the request: the key the other tables refer to"),
              ("request", STR, "the request id string (the x-request-id sent: the trace key)"),
              ("replica", I32, "replica of the API server that served it (null: no API request recorded)"),
              ("thread_id", I64, "the API server thread that recorded its API events (threads.thread_id)"),
              ("arrival_ns", I64, "REQUEST_ARRIVE (API handler entry); where only a later API event was "
                                  "recorded, that one's time; null: no API request recorded"),
              ("first_text_ns", I64, "first text chunk written to the client (null: none)"),
              ("first_audio_ns", I64, "first audio packet written to the client: where TTFP ends (null: none)"),
              ("end_ns", I64, "REQUEST_END, the last byte sent (null: not recorded)"),
              ("last_ns", I64, "the request span's end: end_ns, else its last recorded event (null: no "
                               "API request recorded)"),
              ("ttft_ns", I64, "first_text_ns - arrival_ns"),
              ("ttfp_ns", I64, "first_audio_ns - arrival_ns: time to first audio packet"),
              ("status", ENUM, "ok, error or cancelled, from REQUEST_END (null: not recorded)"),
              ("prompt_tokens", I64, "prompt tokens, from REQUEST_ARRIVE (null: unknown)"),
              ("max_tokens", I64, "max output tokens asked for, from REQUEST_ARRIVE (null: unknown)"),
              _INCOMPLETE), "load"),
    Table("stage_visits", "One row per request x stage x replica: the request's life in one stage "
          "process (STAGE_ADD -> STAGE_SCHEDULE -> STAGE_FINISH) and its outputs.", _cols(
              _REQ,
              ("stage", I32, "the stage (stages.stage)"),
              ("replica", I32, "the stage's replica"),
              ("thread_id", I64, "the scheduler thread that recorded it (threads.thread_id)"),
              ("add_ns", I64, "STAGE_ADD: the request reached the stage's waiting queue (where it was not "
                              "recorded, the visit's first recorded event)"),
              ("schedule_ns", I64, "STAGE_SCHEDULE: admitted into the running batch (null: not recorded)"),
              ("finish_ns", I64, "STAGE_FINISH (null: not recorded)"),
              ("last_ns", I64, "the visit's end: finish_ns, else its last recorded event"),
              ("status", I64, "STAGE_FINISH's status (0 ok; null: not finished)"),
              ("first_emit_ns", I64, "the stage's first output handed to the API server (null: none)"),
              ("first_audio_emit_ns", I64, "its first audio output (null: none)"),
              ("emits", I64, "outputs handed to the API server"),
              _INCOMPLETE), "load"),
    Table("emits", "One row per output a stage handed to the API server (STAGE_EMIT).", _cols(
        _REQ, ("stage", I32, "the emitting stage"), ("replica", I32, "its replica"),
        ("t_ns", I64, "when it was handed over"), ("packet", I64, "the output's index"),
        ("modality", ENUM, "text or audio")), "load"),
    Table("api_marks", "The API server's marks inside a request (they split its share of TTFP).", _cols(
        _REQ, ("t_ns", I64, "when"),
        ("mark", ENUM, "omni.api.parsed (body read), omni.api.dispatched (handed to the first stage), "
                       "omni.api.packet_received (first audio packet out of the stage pipe), "
                       "omni.api.packet_resumed (its stream handler resumed)")), "load"),
    Table("snapshots", "One row per chunk snapshot (the producer copying the live request for the "
          "async chunk), SNAPSHOT_BEGIN -> SNAPSHOT_END.", _cols(
              *_hop("producer", "producer's scheduler"),
              ("start_ns", I64, "SNAPSHOT_BEGIN"), ("end_ns", I64, "SNAPSHOT_END"),
              ("dur_ns", I64, "end_ns - start_ns"),
              ("strategy", ENUM, "copy or recursive (null: an incomplete span)"), _INCOMPLETE), "load"),
    Table("fifo_tasks", "One row per chunk task through the producer's FIFO, FIFO_ENQUEUE -> FIFO_DEQUEUE, "
          "with the time its sender worked on other requests' tasks meanwhile (head-of-line blocking).", _cols(
              *_hop("producer", "producer's scheduler"),
              ("sender_id", I64, "the FIFO's sender (senders.sender_id)"),
              ("enqueue_ns", I64, "FIFO_ENQUEUE"), ("dequeue_ns", I64, "FIFO_DEQUEUE by the sender"),
              ("residence_ns", I64, "dequeue_ns - enqueue_ns: time in the FIFO"),
              ("ahead", I32, "tasks already in the FIFO at the enqueue (depth before it; null: an "
                                 "incomplete task)"),
              ("blocked_ns", I64, "overlap of [enqueue, dequeue] with the sender's tasks of other requests "
                                  "(sender_tasks); null for an incomplete task"),
              ("blocked_by", IDS, "the (up to three) other requests with the largest overlap, largest "
                                  "first (request_id)"),
              _INCOMPLETE), "load"),
    Table("payloads", "One row per chunk payload the sender built, PROCESS_BEGIN -> PROCESS_END.", _cols(
        *_hop("producer", "producer's sender"),
        ("start_ns", I64, "PROCESS_BEGIN"), ("end_ns", I64, "PROCESS_END"), ("dur_ns", I64, "end_ns - start_ns"),
        ("bytes", I64, "payload bytes (0: the processor produced no chunk; null: an incomplete "
                    "span)"),
        _INCOMPLETE), "load"),
    Table("puts", "One row per chunk written to shared memory, PUT_BEGIN -> PUT_END.", _cols(
        *_hop("producer", "producer's sender"),
        ("start_ns", I64, "PUT_BEGIN"), ("end_ns", I64, "PUT_END"), ("dur_ns", I64, "end_ns - start_ns"),
        ("bytes", I64, "bytes written (null: an incomplete span)"), _INCOMPLETE), "load"),
    Table("gets", "One row per chunk read from shared memory by the consumer's receiver, "
          "GET_BEGIN -> GET_END.", _cols(
              *_hop("consumer", "consumer's receiver"),
              ("start_ns", I64, "GET_BEGIN: the poll that found the chunk"), ("end_ns", I64, "GET_END"),
              ("dur_ns", I64, "end_ns - start_ns"), ("bytes", I64, "bytes read (null: an incomplete span)"),
              _INCOMPLETE), "load"),
    Table("waits", "One row per received chunk waiting for the consumer's scheduler, CHUNK_READY -> "
          "CHUNK_SCHEDULED.", _cols(
              *_hop("consumer", "consumer's receiver"),
              ("ready_ns", I64, "CHUNK_READY: the receiver committed the chunk"),
              ("scheduled_ns", I64, "CHUNK_SCHEDULED: the scheduler took it into a step"),
              ("wait_ns", I64, "scheduled_ns - ready_ns"), _INCOMPLETE), "load"),
    Table("poll_lags", "One row per chunk from the producer's PUT_END to the consumer's GET_BEGIN (the "
          "receiver's poll finding it).", _cols(
              *_hop("consumer", "consumer's receiver"),
              ("put_end_ns", I64, "the producer's PUT_END"), ("get_begin_ns", I64, "the consumer's GET_BEGIN"),
              ("lag_ns", I64, "get_begin_ns - put_end_ns (0 where the get began first)")), "load"),
    Table("senders", "One row per FIFO sender: one sender thread per (process, stage).", _cols(
        ("sender_id", I64, "the sender's number: the key sender_tasks and fifo_tasks refer to"),
        ("pid", I64, "its process (processes.pid)"), ("stage", I32, "the stage whose FIFO it drains"),
        ("replica", I32, "the stage's replica")), "load"),
    Table("sender_tasks", "One row per task a sender worked on, FIFO_DEQUEUE to its PUT_END (or a 0-byte "
          "PROCESS_END of its chunk, or the next dequeue): the busy intervals head-of-line blocking "
          "is measured against.", _cols(
              ("sender_id", I64, "the sender (senders.sender_id)"), _REQ,
              ("start_ns", I64, "FIFO_DEQUEUE"), ("end_ns", I64, "the task's end (see above)"),
              ("dur_ns", I64, "end_ns - start_ns")), "load"),
    Table("processes", "One row per recorded process.", _cols(
        ("pid", I64, "process id"), ("role", STR, "api or stage"),
        ("stage", I32, "its stage (-1: the API server)"), ("replica", I32, "its replica"),
        ("name", STR, "the process's name: api or the stage's name")), "load"),
    Table("threads", "One row per recording thread (one ring each).", _cols(
        ("thread_id", I64, "the ring's number: the key the other tables' thread_id refers to"),
        ("pid", I64, "its process (processes.pid)"), ("tid", I64, "its native thread id"),
        ("thread", STR, "the thread's name (scheduler, sender, receiver, api, ...)"),
        ("role", STR, "api or stage"), ("stage", I32, "its process's stage"),
        ("replica", I32, "its process's replica")), "load"),
    Table("stages", "One row per stage.", _cols(
        ("stage", I32, "the stage number (-1: the API server)"), ("name", STR, "its name")), "load"),
    Table("bench_requests", "One row per request `omnitrace bench` sent (bench.json): the client's view.",
          _cols(
              _REQ, ("concurrency", I64, "the bench level it was sent at"),
              ("warmup", BOOL, "a warm-up request (the report leaves it out)"),
              ("start_ns", I64, "when the client sent it"),
              ("ttft_ns", I64, "client-side time to first text (null: none)"),
              ("ttfp_ns", I64, "client-side time to first audio packet (null: none)"),
              ("latency_ns", I64, "client-side time to the last byte (null: none)"),
              ("input_len", I64, "prompt tokens asked for"), ("output_len", I64, "output tokens asked for"),
              ("error", STR, "why it failed (null: succeeded)")), "bench"),
    Table("segments", "The report's critical-path attribution: one row per segment of each attributed "
          "measured request's TTFP, from arrival to first audio packet, gapless.", _cols(
              _REQ, ("stage", I32, "the stage the time is charged to (-1: the API server)"),
              ("category", ENUM, "what the time was (the report's categories: docs/bench-and-report.md)"),
              ("detail", STR, "how the walk placed it (null: plainly)"),
              ("start_ns", I64, "segment start"), ("end_ns", I64, "segment end"),
              ("dur_ns", I64, "end_ns - start_ns")), "report"),
    Table("hops", "The report's critical path per attributed request: each producer -> consumer hop and "
          "the chunk that gated it.", _cols(
              _REQ, ("producer_stage", I32, "the stage that sent the gating chunk"),
              ("consumer_stage", I32, "the stage that took it"),
              ("gating_chunk", I32, "the chunk whose arrival gated the consumer's output: its FIFO "
                                    "tasks with chunk <= gating_chunk were on the critical path")), "report"),
    Table("runs", "One row per run directory given, in the order given (one for a single run).", (
        Column("run", I32, "the run's number: the key every table's run refers to"),
        Column("path", STR, "the run directory as given"),
        Column("run_id", STR, "its run id (run.json; else the directory's name)")), "runs"),
)}


class SchemaError(ValueError):
    """Columns that are not the table's declared ones."""


def arrow_table(name: str, columns: dict[str, pa.Array]) -> pa.Table:
    """``columns`` as table ``name``, in the declared order and types (a missing or
    undeclared column is an error: the schema above is the only one)."""
    t = TABLES[name]
    got, want = set(columns), [c.name for c in t.columns]
    if "run" not in got and t.source != "runs":  # one run: run 0 (tables.combine numbers several)
        columns = {"run": np.zeros(len(next(iter(columns.values()), ())), np.int32), **columns}
        got.add("run")
    if got != set(want):
        raise SchemaError(f"{name}: columns {sorted(got ^ set(want))} differ from the declared ones")
    return pa.Table.from_arrays([pa.array(columns[c.name], c.type) if not isinstance(columns[c.name], pa.Array)
                                 else columns[c.name].cast(c.type) for c in t.columns], schema=t.schema())


def describe(names: list[str] | None = None) -> str:
    """The tables and their columns as text (``omnitrace sql --tables``)."""
    out = []
    for t in TABLES.values():
        if names is not None and t.name not in names:
            continue
        out.append(f"{t.name}: {t.doc}")
        w = max(len(c.name) for c in t.columns)
        out += [f"  {c.name:<{w}}  {_type_name(c.type):<8} {c.doc}" for c in t.columns]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return "enum"
    return {"int32": "int32", "int64": "int64", "string": "string", "bool": "bool",
            "double": "float64"}.get(str(t), "list")


SOURCES = {"load": "the event log", "bench": "bench.json", "report": "the report's walk",
           "runs": "the run directories given"}


def markdown() -> str:
    """The tables and their columns as the reference section of docs/tables.md (a test
    holds that page's section equal to this)."""
    out = []
    for t in TABLES.values():
        out += [f"### `{t.name}`", "", f"{t.doc} *From {SOURCES[t.source]}.*", "",
                "| column | type | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {_type_name(c.type)} | {c.doc} |" for c in t.columns]
        out.append("")
    return "\n".join(out)
