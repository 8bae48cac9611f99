"""The run directory's file names: every reader and writer takes them from here."""
from __future__ import annotations

import os

RUN = "run.json"  # the run's metadata and final status (the agent's, then `omnitrace run`'s)
AGENT = "agent.json"  # the agent's counters, rewritten while it runs
BENCH = "bench.json"  # `omnitrace bench`'s requests and measured windows
PROCESSES = "processes.jsonl"  # one line per instrumented process the agent saw
METRICS = "metrics.jsonl"  # OTLP/JSON metrics lines
SPANS = "spans.jsonl"  # runs recorded before the event log: refused by the loader (spanload)
EVENTS_BIN = "events.bin"  # an older event file, removed by --overwrite
PROFILES = "profiles"  # --flame's output (omnitrace.profile)
PROFILES_INDEX = os.path.join(PROFILES, "index.json")
TABLE_CACHE = ".table-cache"  # a long run's tables, kept by `sql` and `export --parquet` (omnitrace.tables.cache)
LOCK = ".omnitrace-lock"
RESERVE = ".omnitrace-reserve"

# what shows a directory already holds a run (with the event log's segments)
RUN_FILES = (RUN, AGENT, SPANS)
# what --overwrite removes of an earlier run (with the segments and profiles/)
EARLIER_RUN = (RUN, AGENT, SPANS, METRICS, PROCESSES, BENCH, EVENTS_BIN, RESERVE)


def path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, name)
