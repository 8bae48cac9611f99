"""Load one or several run directories (docs/run-directory.md) into plain Python data.

Collect -> data: this module only parses. It never raises on a damaged directory: a
missing file, a truncated last line or a torn event segment (agent killed mid-write)
becomes a labelled warning in :attr:`Run.warnings`, and whatever could be read is kept.

A run directory's event log is read by the one loader (``spanload``) into the report's
tables (``tables.ReportTables``): request, stage and queue spans, chunk spans and the
figures' rows, all as typed tables. A run recorded before the event log (spans.jsonl) is one
line, :class:`RunDirError`, from that loader.
"""
from __future__ import annotations

import functools
import gc
import os
import time
from typing import Any, Callable

import numpy as np

from omnitrace import conventions as cv
from omnitrace import rowops
from omnitrace import spantable as stt
from omnitrace.runfiles import names, read
from omnitrace.runfiles.claim import live_agent
from omnitrace.analyze import tables
from omnitrace.rules.headofline import busy_of
from omnitrace.analyze.run import Run


# event segments from which the report's load also makes the request tables for `sql`
# (~3M events: a load of seconds; the tables are kept only for a load that long)
KEEP_FOR_SQL_BYTES = 16 << 20


class RunDirError(Exception):
    """A run directory that cannot be analysed at all (one clear line for the user)."""


def _load_json(run_dir: str, name: str, pre: str, warnings: list[str]) -> dict[str, Any] | None:
    """run.json, agent.json or bench.json: checked (a file omnitrace did not write is one
    line, RunDirError); an unreadable one is a warning and left out."""
    try:
        return read.read(run_dir, name)
    except read.UnreadableFile as exc:
        warnings.append(f"{pre}{exc}; ignored")
        return None
    except read.RunFileError as exc:
        raise RunDirError(f"{pre}{exc}") from None


def _add_tables(run: Run, acc: tables.ReportTables, requests: list[str], rings: dict[int, dict],
                replica_of: dict[int, int]) -> None:
    """A loaded run directory's tables into ``run`` (:func:`add_tables`), and its stages' names."""
    spans, early, figures, busy = acc.finish(replica_of)
    add_tables(run, spans, figures, early, busy, requests)
    visited = np.unique(spans.visits["stage"][spans.visits["name"] == stt.N_STAGE]).tolist()
    names = cv.stage_names(rings)
    for stage in visited:  # the report names the stages that have stage spans
        run.stage_names.setdefault(stage, names.get(stage) or cv.stage_name(None, stage))


def add_tables(run: Run, spans: stt.SpanTables, figures: tables.ChunkFigures, early, busy: dict,
               requests: list[str]) -> None:
    """Append a run directory's request, stage and queue spans with their emits
    (``spans``), figure tables, early chunk rows (``tables.EARLY_DTYPE``) and senders' busy
    intervals to ``run``'s, their request ids re-numbered into ``run.chunk_requests``
    (several run directories merge into one table; a (stage, replica) present in two keeps
    one timeline)."""
    index = {r: i for i, r in enumerate(run.chunk_requests)}
    remap = np.zeros(len(requests), np.uint32)
    for i, r in enumerate(requests):
        j = index.get(r)
        if j is None:
            j = index[r] = len(run.chunk_requests)
            run.chunk_requests.append(r)
        remap[i] = j
    if not np.array_equal(remap, np.arange(len(requests))):  # the first run: ids unchanged
        early["req"] = remap[early["req"].astype(np.int64)]  # early rows name no culprits
        for t in (spans.requests, spans.visits, spans.emits):
            t["req"] = remap[t["req"].astype(np.int64)]
        figures = figures.renumbered(remap, len(run.chunk_requests))
        busy = {k: (s, e, remap[r.astype(np.int64)]) for k, (s, e, r) in busy.items()}
    run.request_spans = stt.SpanTables.concat([run.request_spans, spans])
    run.figures = figures if run.figures is None else run.figures.merged(figures)
    run.early = early if run.early is None else rowops.concat((run.early, early), early.dtype)
    run.busy = busy_of([*run.busy.items(), *busy.items()]) if run.busy else busy  # one deployment's timelines as one


def load_events(path: str, run: Run, label: str, skip: frozenset[str] = frozenset(),
                run_json: dict[str, Any] | None = None, agent: dict[str, Any] | None = None,
                later: list[Callable[[], None]] | None = None) -> bool:
    """Append the spans built from one run directory's event log, and its accounting
    (from ``run_json`` and ``agent``, the directory's files); False if it has no log.
    ``later``: as :func:`load_run`'s."""
    from omnitrace import eventlog, spanload
    from omnitrace.analyze import accounting, tables
    acc = tables.ReportTables(skip)
    along = _alongside(path)
    t0 = time.monotonic()
    try:
        built = spanload.load(path, [acc] + ([along.sink] if along else []))
    except eventlog.EventLogError as exc:
        raise RunDirError(str(exc)) from None
    if built is None:
        return False
    if along is not None:
        keep = functools.partial(_keep, along, built, time.monotonic() - t0)
        keep() if later is None else later.append(keep)
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
    names = log.requests.strings
    run.delivery_timeouts.extend(sorted(((s, t, names[r], c) for s, t, r, c in built.timeouts),
                                        key=lambda x: x[1]))
    for rid, n in acc.repeated.items():
        run.repeated_ids[rid] = run.repeated_ids.get(rid, 0) + n
    run.skipped_spans += acc.skipped
    run.span_count += acc.rows - acc.skipped
    _add_tables(run, acc, log.requests.strings, log.rings, spanload.replica_of(log.rings))
    return True


def _alongside(path: str):
    """The request tables' sink for ``sql`` where ``path``'s log is large (else None: a
    short load is not kept, and the report does not import the tables' Arrow for it)."""
    from omnitrace import eventlog
    if eventlog.size(path) < KEEP_FOR_SQL_BYTES:
        return None
    from omnitrace.tables import run as tables_run
    return tables_run.Alongside(path)


def _keep(along, built, load_s: float) -> None:
    """The request tables made alongside the report's load, kept for ``sql`` (where the
    load was long enough and the directory takes them)."""
    from omnitrace.analyze import accounting
    from omnitrace.tables import cache
    if load_s >= cache.MIN_LOAD_S:
        made = along.tables(built)
        cache.keep(along.run_dir, made, accounting.notes_of_load(along.run_dir, built.log, built.events), load_s)


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


def _leftovers(paths: list[str], files: dict[str, tuple], died: bool) -> list[str]:
    """What the served processes left in /dev/shm (run.json ``shm_leftovers``, removed
    after the run), said only where a stage died: chunk segments written and never read,
    or a stage death in the record. vLLM-Omni leaves one wake directory per stage on every
    clean stop: those alone are housekeeping, counted in run.json, not a warning."""
    out = []
    for p in paths:
        left = (files.get(p, (None, None))[0] or {}).get("shm_leftovers")
        if not isinstance(left, dict) or not (left.get("chunk_segments") or died and left.get("wake_dirs")):
            continue
        pre = f"{os.path.basename(os.path.normpath(p))}/" if len(paths) > 1 else ""
        out.append(f"{pre}the served processes left /dev/shm entries, removed after the run: "
                   f"{len(left.get('chunk_segments') or ())} chunk segment(s) never read, "
                   f"{len(left.get('wake_dirs') or ())} vLLM-Omni wake director(ies) of exited stages "
                   + ("(a stage died mid-request)" if died else "(a stage died, or requests were cut off, "
                                                               "mid-request?)"))
    return out


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


def _warmup_ids(bench: dict[str, Any] | None) -> set[str]:
    """Warm-up request ids from bench.json: their spans are never needed (saves time)."""
    if not bench:
        return set()
    return {str(r["id"]) for r in bench.get("requests") or () if isinstance(r, dict) and r.get("warmup")
            and r.get("id")}


# run.json statuses other than "complete" (written by the agent: omnitrace.cli.agent)
_STATUS_NOTES = {
    "interrupted": "the run was stopped by SIGINT (Ctrl-C)",
    "terminated": "the run was stopped by SIGTERM",
    "hangup": "the run was stopped by SIGHUP (its terminal or its launcher went away)",
    "launcher-killed": "omnitrace run was killed; the agent stopped the command and recorded it "
                       "to its end: requests sent after that have no trace",
    "agent-killed": "the agent died while the command ran: events after that were not recorded",
    "drain-failed": "the agent's drain thread failed: events after that were not recorded",
    "running": "the run never finished (every process of it killed at once?): no final counts",
}


def status_note(status: str, live: bool = False) -> str:
    """One line on a run.json status other than complete (``live``: its agent runs)."""
    if status == "running" and live:
        return "run status 'running': the run is still recording; results are partial"
    why = _STATUS_NOTES.get(status, "the run did not finish cleanly")
    return f"run status {status!r}: {why}; results are partial"


def restart_notes(run_json: dict) -> list[str]:
    """One line per agent that died and was replaced (run.json ``agent_restarts``): when its
    death was noticed (``omnitrace run`` polls every 0.1 s), when it had last written its
    counters, and how soon the successor took its rings over."""
    out = []
    start = run_json.get("started_unix_ns")
    for r in run_json.get("agent_restarts") or ():
        if not isinstance(r, dict) or not all(isinstance(r.get(k), int) for k in ("restarted_unix_ns",
                                                                                 "noticed_unix_ns")):
            continue
        at = f"{(r['noticed_unix_ns'] - start) / 1e9:.1f} s into the run" if isinstance(start, int) else "?"
        seen = r.get("last_seen_unix_ns")
        seen_s = (f", {(r['noticed_unix_ns'] - seen) / 1e9:.1f} s after its last counters"
                  if isinstance(seen, int) else "")
        out.append(f"the agent (pid {r.get('pid')}) died ({r.get('ended', '?')}), noticed {at}{seen_s}; "
                   f"pid {r.get('new_pid')} took over its rings "
                   f"{(r['restarted_unix_ns'] - r['noticed_unix_ns']) / 1e9:.3f} s later: what it had read "
                   "and not yet written is lost, what the rings dropped meanwhile is counted (see the "
                   "event accounting)")
    return out


def run_identity(path: str) -> tuple:
    """What makes two paths one run: run.json's run id (a copy of the directory is the same
    run), else the directory itself (symlinks and other spellings resolved)."""
    rid = read.run_id(path)
    if rid:
        return ("run", rid)
    st = os.stat(path)
    return ("dir", st.st_dev, st.st_ino)


def distinct_runs(paths: list[str]) -> tuple[list[str], list[str]]:
    """``paths`` with each run once (the first spelling kept), and one line per repeat."""
    seen: dict[tuple, str] = {}
    keep, said = [], []
    for p in paths:
        key = run_identity(p) if os.path.isdir(p) else ("missing", p)
        if key in seen:
            said.append(f"{p} is the same run as {seen[key]} (given twice): read once")
            continue
        seen[key] = p
        keep.append(p)
    return keep, said


def load_run(paths: list[str], skip_warmup: bool = True, later: list[Callable[[], None]] | None = None) -> Run:
    """Load and merge run directories (e.g. one per host of one deployment). ``later``:
    the request tables a long run's load made for ``sql`` are kept by calling what is added
    to it once the caller is done with the run (a report: they then add nothing to its peak
    memory); None: kept at once."""
    # Millions of small acyclic objects: the cyclic GC would rescan them again and again
    # (superlinear time); nothing here makes cycles, so it is paused while loading.
    was = gc.isenabled()
    gc.disable()
    try:
        return _load_run(paths, skip_warmup, later)
    finally:
        if was:
            gc.enable()


def _load_run(paths: list[str], skip_warmup: bool, later: list[Callable[[], None]] | None) -> Run:
    if not paths:
        raise RunDirError("no run directory given")
    paths, repeats = distinct_runs(paths)
    run = Run(paths=list(paths), warnings=repeats)
    files: dict[str, tuple[dict | None, dict | None]] = {}  # path -> (run.json, agent.json)
    for p in paths:
        if not os.path.isdir(p):
            raise RunDirError(f"{p}: not a run directory (does not exist or is not a directory)")
        label = os.path.basename(os.path.normpath(p)) if len(paths) > 1 else ""
        pre = f"{label}/" if label else ""
        rj = _load_json(p, names.RUN, pre, run.warnings)
        if rj is None:
            run.warnings.append(f"{pre}run.json missing: run metadata unknown (agent killed before writing it?)")
        else:
            run.run_json.append(rj)
            if rj.get("status") not in (None, "complete"):
                run.warnings.append(pre + status_note(str(rj.get("status")), live_agent(p) is not None))
            run.warnings.extend(pre + w for w in restart_notes(rj))
            left = rj.get("shm_leftovers")
            if isinstance(left, dict) and left.get("chunk_segments_kept"):
                run.warnings.append(
                    f"{pre}{len(left['chunk_segments_kept'])} chunk segment(s) never read were left "
                    f"in /dev/shm: process(es) {left.get('alive_pids')} of the run outlived it")
        aj = _load_json(p, names.AGENT, pre, run.warnings)
        if aj is None:
            run.warnings.append(f"{pre}agent.json missing: recorder counters (events, drops) unknown")
        else:
            run.agent.append(aj)
        bj = _load_json(p, names.BENCH, pre, run.warnings)
        if bj is not None and run.bench is None:
            run.bench = bj
        files[p] = (rj, aj)
        torn: list[str] = []
        run.processes.extend(read.read_processes(p, torn))
        run.warnings.extend(pre + w for w in torn)
        from omnitrace.profile.finalize import warnings_for  # --flame runs: missing profiles
        run.warnings.extend(pre + w for w in warnings_for(p))
    why = _bench_outside(run.bench, run.run_json)
    if why:
        run.warnings.append(why)
    skip = frozenset(_warmup_ids(run.bench) if skip_warmup else ())
    for p in paths:
        label = os.path.basename(os.path.normpath(p)) if len(paths) > 1 else ""
        pre = f"{label}/" if label else ""
        if not load_events(p, run, pre, skip, *files.get(p, (None, None)), later=later):
            run.warnings.append(f"{pre}events/ missing: no events recorded")
    run.warnings.extend(_leftovers(paths, files, bool(run.stage_deaths)))
    if not len(run.request_spans) and not run.bench and not run.run_json and not run.agent:
        raise RunDirError(f"{', '.join(paths)}: no omnitrace run files found (run.json, events/, "
                          "bench.json, agent.json all missing or unreadable)")
    return run
