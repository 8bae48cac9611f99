"""The attribution categories: THE vocabulary, in one place.

Each category's name, the one-line meaning every output shows next to it (report --json
``categories``, console legend, HTML hover) and its colour in every plot. Adding a
category is one entry here plus its rule (``omnitrace.rules.attribution``); a test
fails if an entry lacks a description or a colour.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    name: str
    description: str
    color: str


PARSE = "parse"
DISPATCH = "dispatch"
QUEUE = "queue"
COMPUTE = "compute"
SNAPSHOT = "snapshot"
FIFO_OWN = "fifo_own"
FIFO_BLOCKED = "fifo_blocked"
PROCESS = "process"
PUT = "put"
POLL_LAG = "poll_lag"
GET = "get"
WAIT_SCHEDULE = "wait_schedule"
DELIVER = "deliver"
LOOP_LAG = "loop_lag"
SSE_WRITE = "sse_write"
REMAINDER = "remainder"
# THE category list, in path order (arrival -> first packet), with the one-line meaning
# every output shows next to it (report --json `categories`, console legend, HTML hover).
DESCRIPTIONS = {
    PARSE: "API: reading and validating the request body (arrival -> parsed)",
    DISPATCH: "request handed to the first stage: the API's queue put (api row), then its wait in "
              "the stage's inbox until the scheduler loop takes it (stage row: a running step delays it)",
    QUEUE: "waiting in the stage scheduler's queue before admission into a batch",
    WAIT_SCHEDULE: "input chunk received, waiting for the consumer's scheduler to take it into a step",
    COMPUTE: "the stage computing: from its gating input taken into a step to the output it made",
    SNAPSHOT: "copying the live request for the async chunk (save_async snapshot)",
    FIFO_BLOCKED: "chunk task in the producer's FIFO while the sender worked on OTHER requests' "
                  "tasks (head-of-line blocking)",
    FIFO_OWN: "rest of the FIFO residence: the sender busy with this request's tasks, waiting for "
              "the GIL or waking up",
    PROCESS: "the sender building the chunk payload",
    PUT: "writing the chunk to shared memory",
    POLL_LAG: "from the producer's put end until the consumer's receiver poll found the chunk",
    GET: "the consumer's receiver reading the chunk from shared memory",
    DELIVER: "stage -> API: the emitted packet crossing the process pipe to the API server",
    LOOP_LAG: "API event loop busy: the packet waited for the loop to run its callback and "
              "resume the stream",
    SSE_WRITE: "API: encoding the first audio packet (chat: a base64 WAV in an SSE chunk; speech: raw "
               "PCM, or a speech.audio.delta event) and handing it to the socket",
    REMAINDER: "time between recorded spans that no hook covers (should be near 0)",
}

# One colour per category, the same in every plot (by name: a new category cannot shift
# the others' colours).
COLORS = {
    PARSE: "#393b79",
    DISPATCH: "#6b6ecf",
    QUEUE: "#8c564b",
    WAIT_SCHEDULE: "#17becf",
    COMPUTE: "#1f77b4",
    SNAPSHOT: "#ff7f0e",
    FIFO_BLOCKED: "#d62728",
    FIFO_OWN: "#e377c2",
    PROCESS: "#9467bd",
    PUT: "#2ca02c",
    POLL_LAG: "#bcbd22",
    GET: "#98df8a",
    DELIVER: "#637939",
    LOOP_LAG: "#e7ba52",
    SSE_WRITE: "#ad494a",
    REMAINDER: "#c7c7c7",
}
VOCABULARY = tuple(Category(n, DESCRIPTIONS[n], COLORS[n]) for n in DESCRIPTIONS)
CATEGORIES = tuple(DESCRIPTIONS)  # in path order (arrival -> first packet)
