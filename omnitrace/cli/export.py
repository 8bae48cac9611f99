"""`omnitrace export RUN (--otlp-json FILE | --otlp-endpoint URL | --parquet DIR |
--perfetto FILE)`: every span of a run, rebuilt from its event log, as OTLP/JSON lines (the
Collector's file format, one ``ExportTraceServiceRequest`` per line) or sent to an OTLP
collector (Jaeger, Tempo, an OpenTelemetry Collector) with the official exporter; or the
run's tables (``omnitrace.tables``, docs/tables.md) as one Parquet file per table; or its
timeline as a Perfetto trace (``omnitrace.tables.perfetto``). The OTLP spans are the ones
the live exporter sends: same builder (``omnitrace.spantable``), same ids and attributes
(``omnitrace.otlp``).
"""
from __future__ import annotations

import argparse
import os
import sys

from typing import Callable

from omnitrace import eventlog, otlp, spanload
from omnitrace import spantable as stt
from omnitrace import console
from omnitrace.runfiles import read
from omnitrace.cli.helpformat import OneLineParser


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="omnitrace export",
                      description="Rebuild every span of a run from its event log and write it as "
                                  "OTLP/JSON lines or send it to an OTLP endpoint; or write the run's "
                                  "tables as Parquet, or its timeline as a Perfetto trace.")
    p.add_argument("run", metavar="RUN", help="run directory")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--otlp-json", metavar="FILE", help="write OTLP/JSON lines to FILE ('-' = stdout)")
    out.add_argument("--otlp-endpoint", metavar="URL",
                     help="send with OTLP: host:port (gRPC, default) or http(s)://host:port/v1/traces (HTTP)")
    out.add_argument("--parquet", metavar="DIR",
                     help="write every table (docs/tables.md) as DIR/TABLE.parquet")
    out.add_argument("--perfetto", metavar="FILE",
                     help="write a Perfetto trace: tracks per process and thread, spans as slices, "
                          "FIFO depth counters, py-spy samples of a --flame run")
    p.add_argument("--protocol", choices=("grpc", "http"), default=None,
                   help="OTLP protocol for --otlp-endpoint (default: http when the URL has a "
                        "path, else grpc)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per OTLP export (default 10)")
    return p


class OtlpSink:
    """The export's sink of the one load (``spanload.Sink``): each feed's spans converted
    to :class:`omnitrace.otlp.OtlpSpan` (ids and attributes as the live exporter's) and
    handed to ``send(spans)``, a feed at a time (an hour's run is never held whole)."""

    culprits = True  # the spans carry omni.fifo.blocked_by
    steps = False

    def __init__(self, run_id: str, send: Callable[[list[otlp.OtlpSpan]], None]) -> None:
        self.run_id, self.send = run_id, send
        self.spans = 0
        self._conv: otlp.SpanConverter | None = None

    def feed(self, feed: stt.Feed, part: spanload.Part) -> None:
        if self._conv is None:
            self._conv = otlp.SpanConverter(part.requests, part.rings, self.run_id)
        self._conv.rings = part.rings  # a ring may be re-described (a new writer)
        self._conv.add_contexts(feed.contexts)
        spans = self._conv.convert(feed.spans)
        # finished requests' ids and repeat counters can go, as the live exporter does
        self._conv.forget(feed.spans.requests["req"].tolist())
        self.spans += len(spans)
        self.send(spans)


def _run_id(run_dir: str) -> str:
    """run.json's run id (the resource attribute the live exporter sent), else the folder."""
    return read.run_id(run_dir) or os.path.basename(os.path.normpath(run_dir))


def _say_notes(notes: list[str]) -> None:
    for note in notes:
        console.say("export", f"warning: {note}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not os.path.isdir(args.run):
        console.say("export", f"{args.run}: not a run directory")
        return 2
    if args.parquet or args.perfetto:
        return _tables_out(args)
    exporter = None
    if args.otlp_endpoint:
        from omnitrace.agent import export_otlp
        proto = args.protocol or ("http" if "/v1/" in args.otlp_endpoint else "grpc")
        kind = f"otlp-{proto}"
        try:
            endpoint = export_otlp.normalize_endpoint(kind, args.otlp_endpoint)
        except export_otlp.ConfigError as exc:
            console.say("export", f"{exc}")
            return 2
        exporter = export_otlp.QueuedExporter(kind, export_otlp.make_exporter(kind, endpoint, args.timeout),
                                              max_queue_spans=1 << 62)
    run_id = _run_id(args.run)
    out = None
    if exporter is not None:
        resources = export_otlp.ResourceCache(run_id)

        def send(spans: list) -> None:
            exporter.submit([export_otlp.to_readable(s, resources) for s in spans])
    else:
        out = sys.stdout.buffer if args.otlp_json == "-" else None

        def send(spans: list) -> None:
            nonlocal out
            if out is None:  # opened at the first spans: a missing log leaves no file
                out = open(args.otlp_json, "wb")
            out.write(otlp.encode_json_lines(spans, lambda p: otlp.resource_attrs(run_id, p)))
    sink = OtlpSink(run_id, send)
    try:
        loaded = spanload.load(args.run, [sink])
        if loaded is None:
            raise eventlog.EventLogError(f"{args.run}: no event log (events/) in this run directory")
    except (eventlog.EventLogError, OSError) as exc:
        console.say("export", f"{exc}")
        return 2
    finally:
        if out is not None and out is not sys.stdout.buffer:
            out.close()
    if exporter is None and args.otlp_json != "-" and not sink.spans:
        open(args.otlp_json, "wb").close()  # a run without spans: an empty file, not none
    from omnitrace.analyze import accounting
    _say_notes(accounting.notes_of_load(args.run, loaded.log, loaded.events))
    total = sink.spans
    if exporter is not None:
        exporter.close(deadline_s=max(30.0, args.timeout * 3))
        c = exporter.counters()
        lost = c["failed"] + c["dropped"]
        console.say("export", f"{c['exported']} of {total} spans sent to {args.otlp_endpoint}"
                    + (f"; {lost} NOT delivered ({c['last_error'] or 'timed out'})" if lost else ""))
        return 1 if lost else 0
    if args.otlp_json != "-":
        console.say("export", f"{total} spans -> {args.otlp_json}")
    return 0


def _tables_out(args: argparse.Namespace) -> int:
    """--parquet DIR or --perfetto FILE: the run's tables, written."""
    from omnitrace.analyze import accounting, report_tables
    from omnitrace.tables import files
    from omnitrace.tables.run import TablesError
    try:
        if args.parquet:
            loaded = report_tables.load_runs([args.run])
            written = files.write_parquet(loaded.tables, args.parquet)
            notes = loaded.notes
            what = (f"{len(written)} tables ({sum(t.num_rows for t in loaded.tables.values())} rows) "
                    f"-> {args.parquet}")
        else:
            from omnitrace.profile.store import FILE, Store
            samples = os.path.join(args.run, "profiles", FILE)  # a --flame run's py-spy samples
            rt, counts = files.write_perfetto(args.run, args.perfetto,
                                              Store.load(samples) if os.path.exists(samples) else None)
            notes = accounting.notes_of_load(args.run, rt.loaded.log, rt.loaded.events)
            what = f"{sum(counts.values())} slices -> {args.perfetto}"
    except TablesError as exc:
        console.say("export", str(exc))
        return 2
    except OSError as exc:
        console.say("export", f"cannot write: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        return 2
    _say_notes(notes)
    console.say("export", what)
    return 0


if __name__ == "__main__":
    sys.exit(main())
