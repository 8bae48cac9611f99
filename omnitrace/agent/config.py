"""The agent's configuration: one typed object, built once by `omnitrace run` from its
flags and the environment (``omnitrace.cli.run``), validated there, and handed
to the agent process whole as JSON (``--config``). Nothing re-parses flags or env later.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import orjson

from omnitrace import conventions as cv
from omnitrace.record import SHM_DIR

EXPORTERS = ("otlp-grpc", "otlp-http", "prometheus", "file")
OTLP_EXPORTERS = ("otlp-grpc", "otlp-http")


@dataclass(frozen=True)
class AgentConfig:
    run_id: str
    run_dir: str
    # "file" is the run directory's record (always on); the others are live views
    exporters: tuple[str, ...] = ("file",)
    # per OTLP exporter: endpoint, or None for the SDK's own (OTEL_EXPORTER_OTLP_* / default)
    otlp_endpoints: dict[str, str | None] = field(default_factory=dict)
    otlp_timeout_s: float | None = None
    otlp_queue_spans: int = 65536
    prometheus_port: int = cv.DEFAULT_PROMETHEUS_PORT
    prometheus_addr: str = "127.0.0.1"
    # drain period: each cycle's fixed cost (a header read and a decode per ring, a zstd
    # block compressed with cold caches) is paid 5 times a second; a ring that filled an
    # eighth since the last cycle is drained again after HURRY_MS (agent.recorder), so a
    # burst still has the ring's headroom (benchmarks/agent_results.md: 200 vs 100 ms)
    interval_ms: float = 200.0
    metrics_interval_s: float = 10.0  # metrics.jsonl period
    max_run_bytes: int | None = None  # cap on the event log (compressed bytes)
    command: tuple[str, ...] = ()
    shm_dir: str = SHM_DIR
    # an agent started in place of one that died (omnitrace run restarts it): that one's
    # pid, how it ended, when it was last seen writing and when its death was noticed
    takes_over: dict | None = None

    @property
    def otlp_kinds(self) -> list[str]:
        return [k for k in self.exporters if k in OTLP_EXPORTERS]

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> "AgentConfig":
        d = orjson.loads(text)
        if not isinstance(d, dict):
            raise ValueError("agent config: not a JSON object")
        d["exporters"] = tuple(d.get("exporters") or ("file",))
        d["command"] = tuple(d.get("command") or ())
        unknown = [k for k in d["exporters"] if k not in EXPORTERS]
        if unknown:
            raise ValueError(f"unknown exporter {unknown[0]!r} (choose from {', '.join(EXPORTERS)})")
        return cls(**d)
