"""`omnitrace export RUN (--otlp-json FILE | --otlp-endpoint URL)`: every span of a run,
rebuilt from its event log, as OTLP/JSON lines (the Collector's file format, one
``ExportTraceServiceRequest`` per line) or sent to an OTLP collector (Jaeger, Tempo, an
OpenTelemetry Collector) with the official exporter. The spans are the ones the live
exporter sends: same builder (``omnitrace.spantable``), same ids and attributes
(``omnitrace.otlp``).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import orjson

from omnitrace import eventlog, otlp
from omnitrace.spantable import SpanBuilder

BATCH_EVENTS = 1 << 20  # events per feed: bounds memory on long runs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"omnitrace export: {message} (see omnitrace export --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="omnitrace export",
                description="Rebuild every span of a run from its event log and write it as "
                            "OTLP/JSON lines or send it to an OTLP endpoint.")
    p.add_argument("run", metavar="RUN", help="run directory")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--otlp-json", metavar="FILE", help="write OTLP/JSON lines to FILE ('-' = stdout)")
    out.add_argument("--otlp-endpoint", metavar="URL",
                     help="send with OTLP: host:port (gRPC, default) or http(s)://host:port/v1/traces (HTTP)")
    p.add_argument("--protocol", choices=("grpc", "http"), default=None,
                   help="OTLP protocol for --otlp-endpoint (default: http when the URL has a "
                        "path, else grpc)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per OTLP export (default 10)")
    return p


def iter_spans(run_dir: str, seen: dict | None = None):
    """Lists of :class:`omnitrace.otlp.OtlpSpan` for the whole run, feed by feed; the
    decoded event log goes into ``seen["log"]`` (for its accounting)."""
    log = eventlog.read_event_log(run_dir)
    if log is None:
        raise eventlog.EventLogError(f"{run_dir}: no event log (events/) in this run directory")
    if seen is not None:
        seen["log"] = log
    run_id = _run_id(run_dir)
    builder = SpanBuilder(log.rings)
    builder.ring_changed()
    for idx in log.died:
        builder.process_died(int(log.rings.get(idx, {}).get("pid", 0)))
    conv = otlp.SpanConverter(log.requests.strings, log.rings, run_id)
    ev = log.events[np.argsort(log.events["t"], kind="stable")]
    for i in range(0, len(ev), BATCH_EVENTS):
        f = builder.feed(ev[i:i + BATCH_EVENTS])
        conv.add_contexts(f.contexts)
        yield run_id, conv.convert(f.spans, f.emits)
    f = builder.flush()
    yield run_id, conv.convert(f.spans, f.emits)


def _run_id(run_dir: str) -> str:
    """run.json's run id (the resource attribute the live exporter sent), else the folder."""
    try:
        with open(os.path.join(run_dir, "run.json"), "rb") as f:
            rj = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        rj = None
    rid = rj.get("run_id") if isinstance(rj, dict) else None
    return str(rid or os.path.basename(os.path.normpath(run_dir)))


def _say_accounting(run_dir: str, log: eventlog.EventLog) -> None:
    """What the spans leave out: one line, only when not every event is in the record."""
    from omnitrace.analyze import accounting
    led = accounting.of_run_dir(run_dir, log)
    if not accounting.complete(led):
        print(f"omnitrace export: warning: the spans are built from part of the run: "
              f"{accounting.headline(led)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not os.path.isdir(args.run):
        print(f"omnitrace export: {args.run}: not a run directory", file=sys.stderr)
        return 2
    exporter = resources = None
    if args.otlp_endpoint:
        from omnitrace.agent import export_otlp
        proto = args.protocol or ("http" if "/v1/" in args.otlp_endpoint else "grpc")
        kind = f"otlp-{proto}"
        try:
            endpoint = export_otlp.normalize_endpoint(kind, args.otlp_endpoint)
        except export_otlp.ConfigError as exc:
            print(f"omnitrace export: {exc}", file=sys.stderr)
            return 2
        exporter = export_otlp.QueuedExporter(kind, export_otlp.make_exporter(kind, endpoint, args.timeout),
                                              max_queue_spans=1 << 62)
    out = None
    total = 0
    seen: dict = {}
    try:
        for run_id, spans in iter_spans(args.run, seen):
            total += len(spans)
            if exporter is not None:
                if resources is None:
                    resources = export_otlp.ResourceCache(run_id)
                exporter.submit([export_otlp.to_readable(s, resources) for s in spans])
                continue
            if out is None:
                out = sys.stdout.buffer if args.otlp_json == "-" else open(args.otlp_json, "wb")
            out.write(otlp.encode_json_lines(spans, lambda p, r=run_id: otlp.resource_attrs(r, p)))
    except eventlog.EventLogError as exc:
        print(f"omnitrace export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"omnitrace export: {exc}", file=sys.stderr)
        return 2
    finally:
        if out is not None and out is not sys.stdout.buffer:
            out.close()
    _say_accounting(args.run, seen["log"])
    if exporter is not None:
        exporter.close(deadline_s=max(30.0, args.timeout * 3))
        c = exporter.counters()
        lost = c["failed"] + c["dropped"]
        print(f"omnitrace export: {c['exported']} of {total} spans sent to {args.otlp_endpoint}"
              + (f"; {lost} NOT delivered ({c['last_error'] or 'timed out'})" if lost else ""),
              file=sys.stderr)
        return 1 if lost else 0
    if args.otlp_json != "-":
        print(f"omnitrace export: {total} spans -> {args.otlp_json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
