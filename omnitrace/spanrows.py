"""The span builder's output rows (``spantable``): the span names and incomplete reasons
as codes, and a dtype per table. Their one home: the builder and its request state
(``reqstate``) import them from here; readers of the tables reach them through
``spantable``, which names them too."""
from __future__ import annotations

import numpy as np

from omnitrace import conventions as cv

# Span name codes (the tables' ``name`` columns index this tuple).
NAMES = (cv.SPAN_REQUEST, cv.SPAN_STAGE, cv.SPAN_STAGE_QUEUE, cv.SPAN_SNAPSHOT, cv.SPAN_FIFO,
         cv.SPAN_PROCESS, cv.SPAN_PUT, cv.SPAN_GET, cv.SPAN_POLL, cv.SPAN_WAIT_SCHEDULE)
(N_REQUEST, N_STAGE, N_QUEUE, N_SNAPSHOT, N_FIFO, N_PROCESS, N_PUT, N_GET, N_POLL,
 N_WAIT) = range(len(NAMES))
# a chunk's hop: the producer's spans (its task until the payload is written) and the consumer's
PRODUCER_NAMES = (N_SNAPSHOT, N_FIFO, N_PROCESS, N_PUT)
CONSUMER_NAMES = (N_POLL, N_GET, N_WAIT)

# incomplete-span reasons (``reason`` column); 0 = complete
REASONS = ("", "writer-died", "run-ended", "unfinished", "timeout", "consumer-never-scheduled")
(R_NONE, R_WRITER_DIED, R_RUN_ENDED, R_UNFINISHED, R_TIMEOUT,
 R_NEVER_SCHEDULED) = range(len(REASONS))

# The builder's output: a table per span kind, each column one meaning (Perfetto's shape).
# ``req`` indexes the run's request list; ``ring`` is the ring (process) that recorded the
# span; ``reason`` is 0 for a complete span, else a REASONS code.
# omni.request spans, one per API request: its status, prompt and max tokens (-1: unknown)
# and first text and audio packets (unix ns; 0: none).
REQUEST_DTYPE = np.dtype([("req", "<u4"), ("reason", "i1"), ("error", "?"), ("status", "<i2"),
                          ("replica", "<i2"), ("ring", "<i4"), ("start", "<i8"), ("end", "<i8"),
                          ("prompt_tokens", "<i8"), ("max_tokens", "<i8"), ("first_text", "<i8"),
                          ("first_audio", "<i8")])
# omni.stage (STAGE_ADD -> STAGE_FINISH) and omni.stage.queue (STAGE_ADD -> STAGE_SCHEDULE)
# spans, one of each per (request, stage, replica) visit; ``name`` says which.
VISIT_DTYPE = np.dtype([("name", "i1"), ("reason", "i1"), ("error", "?"), ("status", "<i2"),
                        ("stage", "<i2"), ("replica", "<i2"), ("req", "<u4"), ("ring", "<i4"),
                        ("start", "<i8"), ("end", "<i8")])
# A chunk span (``name`` one of PRODUCER_NAMES or CONSUMER_NAMES): the chunk's stage and its
# peer stage; ``figure`` is what its name measures (read it by the names below: a
# snapshot's strategy, a FIFO span's tasks ahead, the payload bytes of process, put and get;
# 0 for the others); a FIFO span's ``blocked`` ns and by0..by2, the requests that blocked it
# most (0: none).
CHUNK_DTYPE = np.dtype([("name", "i1"), ("reason", "i1"), ("stage", "<i2"), ("peer", "<i2"),
                        ("replica", "<i2"), ("req", "<u4"), ("chunk", "<i4"), ("ring", "<i4"),
                        ("start", "<i8"), ("end", "<i8"), ("figure", "<i8"), ("blocked", "<i8"),
                        ("by0", "<u4"), ("by1", "<u4"), ("by2", "<u4")])
STRATEGY = "figure"  # snapshot: its strategy (a conventions.Snapshot value)
AHEAD, BLOCKED = "figure", "blocked"  # fifo: tasks ahead of it at the enqueue; its blocked_ns
BYTES = "figure"  # process, put, get: the payload's bytes
# An omni.emit span event of an emitted stage span, or (modality MARK_MODALITY, stage
# API_STAGE) an API mark of a request span: packet is then the mark's event kind
# (conventions.API_MARKS).
EMIT_DTYPE = np.dtype([("req", "<u4"), ("stage", "<i2"), ("replica", "<i2"), ("t", "<i8"),
                       ("packet", "<i8"), ("modality", "<i4")])
MARK_MODALITY = -1
