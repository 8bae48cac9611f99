"""The one vocabulary of omnitrace: event kinds, span, attribute and metric names.

Hook sites (runtime, patches), the agent, dashboards and reports all import their names
from here; change a name here and only here.
"""
from __future__ import annotations

import hashlib
from enum import IntEnum
from typing import Any, Mapping

# --------------------------------------------------------------------------- events
# Hot-path records (see omnitrace.record). Every record carries:
#   kind, request (string id, interned), stage (the recording process's stage id),
#   chunk (chunk index, -1 when not a chunk event), a, b (kind-specific ints), t (perf_counter_ns).


class Ev(IntEnum):
    """Event kinds written to the rings. `a`/`b` meaning is given per kind."""

    STRING = 1  # string-table entry (internal to omnitrace.record)

    # API server (stage = -1)
    REQUEST_ARRIVE = 10  # a = prompt tokens, b = max_tokens
    REQUEST_DISPATCH = 11  # handed to the first stage's input queue
    REQUEST_FIRST_TEXT = 12
    REQUEST_FIRST_AUDIO = 13  # first audio packet written to the client
    REQUEST_END = 14  # a = status (Status), b = bytes sent to the client
    # API marks that split the API's share of TTFP (analyze.attribution categories)
    REQUEST_PARSED = 15  # body read and validated (REQUEST_ARRIVE is stamped at handler entry)
    PACKET_RECEIVED = 16  # the first audio packet left the stage pipe (API reader thread)
    PACKET_RESUMED = 17  # the request's stream handler resumed with its first audio packet
    # the caller's W3C trace context (omnitrace.tracecontext: fields and encoding)
    REQUEST_TRACE_HI = 18  # a = trace id bits 127..64
    REQUEST_TRACE_LO = 19  # a = trace id bits 63..0; chunk, b = parent span id low, high 32 bits

    # stage scheduler thread (per request)
    STAGE_ADD = 20  # request reached the stage's waiting queue; a = waiting depth
    STAGE_SCHEDULE = 21  # admitted into the running batch; a = batch size after admission
    STAGE_FINISH = 22  # a = status
    STAGE_EMIT = 23  # output handed to the API server; a = packet index, b = Modality

    # stage scheduler thread (per step, request = "")
    STEP_BEGIN = 30  # a = batch size, b = prefill tokens in this step
    STEP_END = 31  # a = batch size

    # producer side of a chunk (b = consumer stage id)
    SNAPSHOT_BEGIN = 40  # scheduler thread
    SNAPSHOT_END = 41  # a = snapshot strategy (Snapshot)
    FIFO_ENQUEUE = 42  # scheduler thread; a = FIFO depth before this task (tasks ahead)
    FIFO_DEQUEUE = 43  # sender thread; a = FIFO depth left after the pop
    PROCESS_BEGIN = 44  # sender thread, payload building
    PROCESS_END = 45  # a = payload bytes (0 = processor produced no chunk)
    PUT_BEGIN = 46
    PUT_END = 47  # a = bytes written, b = consumer stage

    # consumer side of a chunk (b = producer stage id)
    GET_BEGIN = 50  # receiver thread, the poll that hit
    GET_END = 51  # a = bytes read
    CHUNK_READY = 52  # receiver committed the chunk
    CHUNK_SCHEDULED = 53  # consumer scheduler took the chunk into a step

    # errors
    STAGE_DIED = 60  # API server noticed a stage process died; stage = the dead stage
    # MRv2 native data plane: a connector delivery not confirmed by its deadline (vLLM-Omni
    # then quarantines the stage's delivery manager: the stage's later sends fail);
    # stage = the producer, chunk = the connector chunk, a = the deadline in ms
    DELIVERY_TIMEOUT = 61


class Status(IntEnum):
    OK = 0
    ERROR = 1
    CANCELLED = 2


class Modality(IntEnum):
    TEXT = 0
    AUDIO = 1


class Snapshot(IntEnum):
    COPY = 0
    RECURSIVE = 1


NO_CHUNK = -1
API_STAGE = -1
# A request id a client may give (``x-request-id``) that names the request everywhere,
# shared-memory segment names included (the reference pipeline's and vLLM-Omni's speech
# route under omnitrace).
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

# --------------------------------------------------------------------------- data paths
# The ways a request's chunks and first audio leave vLLM-Omni; each hook names the one it
# instruments (``inject.patching.Hook.path``) and ``omnitrace hooks`` says which a deploy
# file takes (``inject.coverage``).
PATH_ALL = ""  # API server, stage schedulers, orchestrator: every path
PATH_V1_ADAPTER = "v1-adapter"  # OmniChunkTransferAdapter in each stage's scheduler process
PATH_MRV2 = "mrv2"  # Model Runner V2's native data plane in each stage's worker
PATH_TALKER_FIRST_AUDIO = "talker-first-audio"  # the Talker delivers the first audio packet
PATH_SHM_CONNECTOR = "shm-connector"  # SharedMemoryConnector put/get (either chunk path)

# --------------------------------------------------------------------------- spans
SPAN_REQUEST = "omni.request"  # API server: arrival -> last byte; events TTFT, TTFP
SPAN_STAGE = "omni.stage"  # per stage per request: add -> finish
SPAN_STAGE_QUEUE = "omni.stage.queue"  # add -> scheduled (scheduler queueing)
SPAN_SNAPSHOT = "omni.chunk.snapshot"
SPAN_FIFO = "omni.chunk.fifo"  # enqueue -> dequeue = FIFO residence
SPAN_PROCESS = "omni.chunk.process"
SPAN_PUT = "omni.chunk.put"
SPAN_GET = "omni.chunk.get"
SPAN_POLL = "omni.chunk.poll_lag"  # producer put end -> consumer get begin
SPAN_WAIT_SCHEDULE = "omni.chunk.wait_schedule"  # ready -> scheduled on the consumer

EVENT_TTFT = "omni.ttft"
EVENT_TTFP = "omni.ttfp"
EVENT_EMIT = "omni.emit"
# API marks, events of omni.request (see Ev.REQUEST_PARSED ...), by event kind
EVENT_API_PARSED = "omni.api.parsed"
EVENT_API_DISPATCHED = "omni.api.dispatched"
EVENT_API_PACKET_RECEIVED = "omni.api.packet_received"
EVENT_API_PACKET_RESUMED = "omni.api.packet_resumed"
API_MARKS = {int(Ev.REQUEST_PARSED): EVENT_API_PARSED, int(Ev.REQUEST_DISPATCH): EVENT_API_DISPATCHED,
             int(Ev.PACKET_RECEIVED): EVENT_API_PACKET_RECEIVED,
             int(Ev.PACKET_RESUMED): EVENT_API_PACKET_RESUMED}

# --------------------------------------------------------------------------- attributes
# Upstream-proposed names (vLLM-Omni RFC #3995 / PR #4670, "OpenTelemetry tracing across
# stages", not merged as of 2026-11): set beside omnitrace's own on every stage-scoped span,
# so omnitrace spans line up with vLLM-Omni's own stage spans once those exist.
ATTR_VLLM_OMNI_STAGE_ID = "vllm_omni.stage.id"
ATTR_VLLM_OMNI_STAGE_NAME = "vllm_omni.stage.name"
ATTR_VLLM_OMNI_REPLICA_ID = "vllm_omni.stage.replica_id"
ATTR_REQUEST_ID = "omni.request.id"
ATTR_STAGE_ID = "omni.stage.id"
ATTR_STAGE_NAME = "omni.stage.name"
ATTR_PEER_STAGE_ID = "omni.peer_stage.id"
ATTR_STAGE_PAIR = "omni.stage_pair"  # "0->1"
ATTR_REPLICA = "omni.replica"
ATTR_CHUNK_INDEX = "omni.chunk.index"
ATTR_TRANSFER_BYTES = "omni.transfer.bytes"
ATTR_FIFO_DEPTH = "omni.fifo.depth"
ATTR_FIFO_AHEAD = "omni.fifo.ahead"
ATTR_FIFO_BLOCKED_NS = "omni.fifo.blocked_ns"
ATTR_FIFO_BLOCKED_BY = "omni.fifo.blocked_by"
ATTR_SNAPSHOT_STRATEGY = "omni.snapshot.strategy"
ATTR_PROMPT_TOKENS = "omni.request.prompt_tokens"
ATTR_MAX_TOKENS = "omni.request.max_tokens"
ATTR_STATUS = "omni.status"
ATTR_PID = "process.pid"
ATTR_PACKET_INDEX = "omni.packet.index"  # on omni.emit span events
ATTR_MODALITY = "omni.modality"  # on omni.emit span events: text | audio
ATTR_ROLE = "omni.role"  # resource attribute: api | stage | bench | other
ATTR_INCOMPLETE = "omni.incomplete"  # span closed by the agent without its end event
ATTR_INCOMPLETE_REASON = "omni.incomplete.reason"  # writer-died | run-ended | timeout | consumer-never-scheduled

SERVICE_NAME = "omnitrace"

# --------------------------------------------------------------------------- metrics
# Seconds; buckets cover 10 us .. 30 s (SDK defaults are tuned for ms).
METRIC_FIFO_RESIDENCE = "omnitrace.fifo.residence"
METRIC_FIFO_BLOCKED = "omnitrace.fifo.blocked"
METRIC_FIFO_DEPTH = "omnitrace.fifo.depth"
METRIC_SNAPSHOT = "omnitrace.snapshot.duration"
METRIC_PROCESS = "omnitrace.payload.build.duration"  # sender thread: dequeue -> payload built
METRIC_PUT = "omnitrace.transfer.put.duration"
METRIC_GET = "omnitrace.transfer.get.duration"
METRIC_SIZE = "omnitrace.transfer.size"
METRIC_TTFT = "omnitrace.request.ttft"
METRIC_TTFP = "omnitrace.request.ttfp"
METRIC_E2E = "omnitrace.request.e2e"  # arrival -> the request's end at the API server
METRIC_EVENTS = "omnitrace.events"
METRIC_DROPPED = "omnitrace.events.dropped"
METRIC_SENDER_BUSY = "omnitrace.sender.busy.seconds"  # a stage's sender thread on tasks

LATENCY_BUCKETS_S = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
SIZE_BUCKETS_BYTES = tuple(float(4 ** i) for i in range(5, 15))  # 1 KiB .. 256 MiB
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Native (exponential) histograms beside the classic buckets: schema 4 = 16 buckets per
# doubling (each 2^(1/16) = 4.4% wider than the last), so a quantile read from them is
# within 4.4% of the exact one; values at or below the threshold count in the zero bucket
# (client_golang's default threshold).
NATIVE_SCHEMA = 4
NATIVE_PER_DOUBLING = 2 ** NATIVE_SCHEMA
NATIVE_ZERO_THRESHOLD = 2.0 ** -128

# Prometheus labels, aligned with vLLM-Omni's own metrics (``stage``, ``replica`` on stage
# series; ``from_stage``, ``to_stage`` on transfer series) so panels can join the two.
LABEL_STAGE = "stage"
LABEL_REPLICA = "replica"
LABEL_FROM_STAGE = "from_stage"
LABEL_TO_STAGE = "to_stage"
LABEL_CATEGORY = "category"
LABEL_STAGE_NAME = "stage_name"
LABEL_STATUS = "status"

# --------------------------------------------------------------------------- environment
ENV_RUN_ID = "OMNITRACE_RUN_ID"  # set by `omnitrace run`; recording is off without it
ENV_RUN_DIR = "OMNITRACE_RUN_DIR"
ENV_ROLE = "OMNITRACE_ROLE"  # api | stage | bench | other
ENV_STAGE = "OMNITRACE_STAGE"
ENV_REPLICA = "OMNITRACE_REPLICA"
ENV_RING_RECORDS = "OMNITRACE_RING_RECORDS"  # records per thread ring (power of two)
ENV_RECORD_WRITER = "OMNITRACE_RECORD_WRITER"  # "python": the reference writer even where the compiled one is built
# `omnitrace run` options (flags win over these)
ENV_EXPORTERS = "OMNITRACE_EXPORTERS"  # comma list: otlp-grpc, otlp-http, prometheus, file
ENV_OTLP_ENDPOINT = "OMNITRACE_OTLP_ENDPOINT"  # else OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT
ENV_PROMETHEUS_PORT = "OMNITRACE_PROMETHEUS_PORT"
DEFAULT_PROMETHEUS_PORT = 9464  # the agent's /metrics, and where `omnitrace top` looks first
ENV_PROMETHEUS_ADDR = "OMNITRACE_PROMETHEUS_ADDR"  # default 127.0.0.1
ENV_RUNS_DIR = "OMNITRACE_RUNS_DIR"  # parent of run directories, default ./omnitrace-runs

SHM_PREFIX = "omnitrace"  # ring segments are /dev/shm/omnitrace.<run-id>.<pid>.<tid>


def trace_id_for(request_id: str) -> int:
    """128-bit trace id derived from the external request id, identical in every process."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:16], "big") or 1


def span_id_for(*parts: object) -> int:
    """Deterministic 64-bit span id, so parents can be named before they are seen."""
    key = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") or 1


def stage_name(process: str | None, stage: int) -> str:
    """A stage's name: its process's, else ``stage<N>``."""
    return process or f"stage{stage}"


def stage_names(rings: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """Each stage's name from a run's rings (ring index -> the event log's RING description):
    the process of its lowest-numbered ring whose role is "stage" (:func:`stage_name`); the
    API's (``API_STAGE``) is "api". The report, the tables and flame's stage filter name
    stages by it."""
    names: dict[int, str] = {}
    for _, ring in sorted(rings.items()):
        stage = int(ring.get("stage", API_STAGE))
        if stage == API_STAGE:
            names.setdefault(stage, "api")
        elif ring.get("role") == "stage":
            names.setdefault(stage, stage_name(ring.get("process"), stage))
    return names


def stage_pair(producer: int, consumer: int) -> str:
    return f"{producer}->{consumer}"
