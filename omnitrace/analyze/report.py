"""Transform: a loaded run -> one JSON-able report dict (console, --json and HTML read it)."""
from __future__ import annotations

import gc
from typing import Any

from omnitrace import __version__
from omnitrace import conventions as cv
from omnitrace.analyze import attribution as at
from omnitrace.analyze.rundir import Run, Span
from omnitrace.analyze.stats import NS_TO_MS, NS_TO_US, median, summary

WATERFALLS = 10  # slowest requests kept with full segments in the HTML


def stage_label(stage: int, names: dict[int, str]) -> str:
    if stage == cv.API_STAGE:
        return "api"
    n = names.get(stage)
    return f"{stage}:{n}" if n else str(stage)


def _agent_counters(run: Run) -> dict[str, Any]:
    """Sum the agent's own counters over all run directories (key names tolerated loosely)."""
    events = dropped = spans = not_recorded = sampled_reqs = sampled_spans = 0
    rings: list[dict[str, Any]] = []
    exporters: dict[str, dict[str, int]] = {}
    known = bool(run.agent)
    for a in run.agent:
        ev = a.get("events_read", a.get("events", 0))
        dr = a.get("events_dropped", a.get("dropped", 0))
        if isinstance(ev, dict):
            ev = ev.get("total", 0)
        if isinstance(dr, dict):
            dr = dr.get("total", 0)
        events += int(ev or 0)
        dropped += int(dr or 0)
        spans += int(a.get("spans_built", a.get("spans", 0)) or 0)
        for ring in a.get("rings", []) or []:
            if isinstance(ring, dict) and int(ring.get("dropped", 0) or 0) > 0:
                rings.append(ring)
        rec = a.get("record") if isinstance(a.get("record"), dict) else {}
        not_recorded += int(rec.get("events_not_recorded", 0) or 0)
        views = a.get("views") if isinstance(a.get("views"), dict) else {}
        sampled_reqs += int(views.get("requests_not_exported", 0) or 0)
        sampled_spans += int(views.get("spans_not_exported", 0) or 0)
        for kind, c in (a.get("exporters") or {}).items():
            if isinstance(c, dict) and kind != "file":
                e = exporters.setdefault(kind, {"exported": 0, "failed": 0, "dropped": 0})
                for k in e:
                    e[k] += int(c.get(k, 0) or 0)
    never = sum(int(r.get("events_never_drained", 0) or 0) for r in run.run_json)
    return {"known": known, "events": events, "dropped": dropped, "spans_built": spans,
            "rings_with_drops": rings, "never_drained": never, "not_recorded": not_recorded,
            "torn_records": run.torn_records, "exporters": exporters,
            "requests_not_exported": sampled_reqs, "spans_not_exported": sampled_spans}


def _measured(run: Run, reqs: dict[str, at.RequestSpans],
              level: int | None = None) -> tuple[set[str], str, dict[str, dict]]:
    """Ids of measured (non-warm-up) requests, how they were chosen, and bench rows by id."""
    b = run.bench
    rows: dict[str, dict] = {}
    if not b:
        run.warnings.append("no bench.json: every traced request is analysed (warm-up not excluded)")
        return set(reqs), "all traced requests (no bench.json)", rows
    for r in b.get("requests", []) or []:
        if isinstance(r, dict) and r.get("id"):
            rows[str(r["id"])] = r
    measured = {i for i, r in rows.items() if not r.get("warmup")}
    levels = sorted({r.get("concurrency") for r in rows.values() if r.get("concurrency") is not None})
    if level is not None:
        measured = {i for i in measured if rows[i].get("concurrency") == level}
        if not measured:
            run.warnings.append(f"no measured request at concurrency {level} (levels: {levels})")
            return set(), f"concurrency {level} (no such level)", rows
    elif len(levels) > 1:
        run.warnings.append(f"bench swept concurrency {levels}: all levels are aggregated together; "
                            "use --concurrency C for one level")
    hit = measured & set(reqs)
    if hit:
        return hit, "bench.json request ids (warm-up excluded)", rows
    windows = [w for w in (b.get("levels") or []) if isinstance(w, dict) and w.get("measured_window")]
    if windows:
        sel: set[str] = set()
        for lv in windows:
            mw = lv["measured_window"]
            lo, hi = int(mw.get("start_unix_ns", 0)), int(mw.get("end_unix_ns", 0))
            sel |= {rid for rid, r in reqs.items() if r.request and lo <= r.request.start <= hi}
        run.warnings.append("bench.json request ids not found in the traces: measured window "
                            "selected by time instead")
        return sel, "bench.json measured window (by time)", rows
    return set(), "bench.json (no measured requests)", rows


def _by_stage(spans: list[Span], key) -> dict[Any, list[Span]]:
    out: dict[Any, list[Span]] = {}
    for s in spans:
        out.setdefault(key(s), []).append(s)
    return out


def build_report(run: Run, per_request_segments: bool = True, level: int | None = None) -> dict[str, Any]:
    was = gc.isenabled()
    gc.disable()  # as in load_run: many small acyclic objects
    try:
        return _build_report(run, per_request_segments, level)
    finally:
        if was:
            gc.enable()


def _build_report(run: Run, per_request_segments: bool, level: int | None) -> dict[str, Any]:
    reqs = at.index_requests(run.spans)
    names: dict[int, str] = {}
    for r in reqs.values():
        for st, sp in r.stages.items():
            n = sp.attrs.get(cv.ATTR_STAGE_NAME) if sp.attrs else None
            if n:
                names.setdefault(st, str(n))
    measured, how, bench_rows = _measured(run, reqs, level)
    recorder = _agent_counters(run)

    atts: list[at.Attribution] = []
    no_ttfp: list[str] = []
    for rid in sorted(measured):
        a = at.attribute(reqs[rid]) if rid in reqs else None
        if a is None:
            no_ttfp.append(rid)
        else:
            atts.append(a)
    bench_measured = {i for i, r in bench_rows.items() if not r.get("warmup")
                      and (level is None or r.get("concurrency") == level)}
    untraced = sorted(bench_measured - set(reqs)) if bench_rows else []

    # ---- per request
    requests: list[dict[str, Any]] = []
    sum_err: list[int] = []
    diffs: list[float] = []
    for a in sorted(atts, key=lambda a: -a.ttfp_ns):
        tot = a.totals()
        err = sum(tot.values()) - a.ttfp_ns
        sum_err.append(abs(err))
        client = bench_rows.get(a.rid, {}).get("ttfp_s")
        client_ms = client * 1e3 if isinstance(client, (int, float)) and client > 0 else None
        if client_ms is not None:
            diffs.append(client_ms - a.ttfp_ns * NS_TO_MS)
        row: dict[str, Any] = {
            "id": a.rid,
            "ttfp_ms": a.ttfp_ns * NS_TO_MS,
            "client_ttfp_ms": client_ms,
            "sum_error_ns": err,
            "categories_ms": {f"{stage_label(s, names)}/{c}": v * NS_TO_MS
                              for (s, c), v in sorted(tot.items())},
            "hops": [f"{p}->{c}#{k}" for p, c, k in a.hops],
            "missing_spans": a.missing,
            "unrecorded_tasks": [f"{p}->{c}#{k}" for p, c, k in a.unrecorded_tasks],
        }
        if per_request_segments:
            row["segments"] = [[(g.start - a.arrival) * NS_TO_MS, g.dur * NS_TO_MS,
                                stage_label(g.stage, names), g.category, g.detail]
                               for g in a.segments]
        requests.append(row)

    # ---- aggregate per stage and category (zeros included so means add up to mean TTFP)
    keys = sorted({k for a in atts for k in a.totals()}, key=lambda k: (k[0] if k[0] >= 0 else 99,
                                                                        at.CATEGORIES.index(k[1])))
    mean_ttfp = sum(a.ttfp_ns for a in atts) / len(atts) if atts else 0.0
    totals = [a.totals() for a in atts]
    agg = []
    for k in keys:
        s = summary([t.get(k, 0) for t in totals], NS_TO_MS)
        agg.append({"stage": stage_label(k[0], names), "stage_id": k[0], "category": k[1],
                    "mean_ms": s["mean"], "p50_ms": s["p50"], "p99_ms": s["p99"],
                    "share": (s["mean"] / (mean_ttfp * NS_TO_MS)) if mean_ttfp else 0.0})

    # ---- FIFO, snapshot, transfer over all chunks of measured requests
    chunk_spans = [s for rid in measured if rid in reqs
                   for d in (*reqs[rid].producer.values(), *reqs[rid].consumer.values())
                   for ss in d.values() for s in ss]
    by = _by_stage(chunk_spans, lambda s: s.name)
    fifo = []
    for st, ss in sorted(_by_stage(by.get(cv.SPAN_FIFO, []), lambda s: s.stage).items()):
        res = summary([s.dur for s in ss], NS_TO_MS)
        blk = summary([min(s.blocked_ns, s.dur) for s in ss], NS_TO_MS)
        depth = [s.depth for s in ss if s.depth >= 0]
        fifo.append({"stage": stage_label(st, names), "stage_id": st, "count": res["count"],
                     "residence_p50_ms": res["p50"], "residence_p99_ms": res["p99"],
                     "residence_max_ms": res["max"], "blocked_p50_ms": blk["p50"],
                     "blocked_p99_ms": blk["p99"],
                     "depth_mean": sum(depth) / len(depth) if depth else None,
                     "depth_max": max(depth) if depth else None,
                     "residence_ms": [s.dur * NS_TO_MS for s in ss]})
    snapshot = []
    for st, ss in sorted(_by_stage(by.get(cv.SPAN_SNAPSHOT, []), lambda s: s.stage).items()):
        sm = summary([s.dur for s in ss], NS_TO_US)
        snapshot.append({"stage": stage_label(st, names), "stage_id": st, "count": sm["count"],
                         "mean_us": sm["mean"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                         "max_us": sm["max"]})
    transfer = []
    pairs = _by_stage([s for s in by.get(cv.SPAN_PUT, []) + by.get(cv.SPAN_GET, [])],
                      lambda s: cv.stage_pair(*((s.stage, s.peer) if s.name == cv.SPAN_PUT
                                                else (s.peer, s.stage))))
    for pair, ss in sorted(pairs.items()):
        row: dict[str, Any] = {"pair": pair}
        for name, tag in ((cv.SPAN_PUT, "put"), (cv.SPAN_GET, "get")):
            xs = [s for s in ss if s.name == name]
            sm = summary([s.dur for s in xs], NS_TO_US)
            nbytes = sum(s.nbytes for s in xs)
            dur = sum(s.dur for s in xs)
            row[tag] = {"count": sm["count"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                        "mean_bytes": nbytes / len(xs) if xs else 0.0,
                        "bandwidth_mb_s": (nbytes / 1e6) / (dur / 1e9) if dur > 0 else None}
        transfer.append(row)

    # ---- head of line: victim x culprit, blocked time split evenly among listed culprits
    hol: dict[tuple[str, str], list[float]] = {}
    for s in by.get(cv.SPAN_FIFO, []):
        if s.blocked_by and s.blocked_ns > 0:
            share = min(s.blocked_ns, s.dur) / len(s.blocked_by)
            for c in s.blocked_by:
                cell = hol.setdefault((s.rid, c), [0.0, 0])
                cell[0] += share * NS_TO_MS
                cell[1] += 1
    hol_rows = sorted(({"victim": v, "culprit": c, "blocked_ms": x[0], "times": x[1]}
                       for (v, c), x in hol.items()), key=lambda r: -r["blocked_ms"])

    server = [a.ttfp_ns * NS_TO_MS for a in atts]
    client = [r["client_ttfp_ms"] for r in requests if r["client_ttfp_ms"] is not None]
    warnings = list(run.warnings)
    if recorder["never_drained"]:
        warnings.insert(0, f"THE AGENT DIED: {recorder['never_drained']} events were never drained "
                           "from the rings; requests they belong to are incomplete")
    if recorder["not_recorded"]:
        warnings.insert(0, f"--max-run-bytes reached: {recorder['not_recorded']} events were not "
                           "recorded; requests after the cap are missing or incomplete")
    if recorder["torn_records"]:
        warnings.append(f"{recorder['torn_records']} events lost in a torn event segment "
                        "(agent killed mid-write)")
    for kind, c in recorder["exporters"].items():
        if c["failed"] or c["dropped"]:
            warnings.append(f"live {kind} exporter did not deliver {c['failed'] + c['dropped']} spans "
                            f"(failed {c['failed']}, dropped {c['dropped']}); `omnitrace export` "
                            "can resend them from the record")
    if recorder["requests_not_exported"]:
        warnings.append(f"the live OTLP exporter fell behind and sampled: {recorder['requests_not_exported']} "
                        f"requests ({recorder['spans_not_exported']} spans) were not exported live")
    if recorder["dropped"] > 0:
        warnings.insert(0, f"RECORDER DROPPED {recorder['dropped']} EVENTS: some spans are missing; "
                           "attribution of affected requests is incomplete")
    if no_ttfp:
        warnings.append(f"{len(no_ttfp)} measured request(s) have no first audio packet in the trace "
                        "(failed, cut off, or still running): not attributed")
    if untraced:
        warnings.append(f"{len(untraced)} measured bench request(s) have no trace at all")
    if not atts:
        warnings.append("no measured request could be attributed")
    unrec = sum(len(a.unrecorded_tasks) for a in atts)
    if unrec:
        warnings.append(f"{unrec} critical-path hop(s) lack the producing task's own snapshot/FIFO/process "
                        "spans (the trace holds only an earlier task under the same chunk index): that "
                        "time is counted as the producer's compute")
    incomplete = sum(reqs[r].incomplete for r in measured if r in reqs)
    if incomplete:
        warnings.append(f"{incomplete} span(s) of measured requests were closed by the agent without "
                        "their end event (omni.incomplete)")
    return {
        "omnitrace_version": __version__,
        "runs": [{"path": p} for p in run.paths],
        "run": [{k: rj.get(k) for k in ("run_id", "status", "command", "host", "started_unix_ns",
                                          "ended_unix_ns", "exit_code")} for rj in run.run_json],
        "warnings": warnings,
        "recorder": recorder,
        "window": {"selection": how, "measured": len(measured), "attributed": len(atts),
                   "no_first_packet": len(no_ttfp), "traced_requests": len(reqs),
                   "spans": len(run.spans), "spans_skipped_warmup": run.skipped_spans},
        "stages": {str(k): v for k, v in sorted(names.items())},
        "ttfp": {"server_ms": summary(server), "client_ms": summary(client),
                 "client_minus_server_median_ms": median(diffs),
                 "client_minus_server_ms": summary(diffs),
                 "sum_error_max_ns": max(sum_err) if sum_err else None},
        "attribution": agg,
        "fifo": fifo,
        "snapshot": snapshot,
        "transfer": transfer,
        "head_of_line": hol_rows,
        "requests": requests,
    }
