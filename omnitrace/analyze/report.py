"""Transform: a loaded run -> one JSON-able report dict (console, --json and HTML read it)."""
from __future__ import annotations

import gc
from typing import Any

import numpy as np

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
    views_failed = ""
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
        if views.get("failed"):
            views_failed = str(views["failed"])
        for kind, c in (a.get("exporters") or {}).items():
            if isinstance(c, dict) and kind != "file":
                e = exporters.setdefault(kind, {"exported": 0, "failed": 0, "dropped": 0})
                for k in e:
                    e[k] += int(c.get(k, 0) or 0)
    never = sum(int(r.get("events_never_drained", 0) or 0) for r in run.run_json)
    return {"known": known, "events": events, "dropped": dropped, "spans_built": spans,
            "rings_with_drops": rings, "never_drained": never, "not_recorded": not_recorded,
            "torn_records": run.torn_records, "exporters": exporters,
            "requests_not_exported": sampled_reqs, "spans_not_exported": sampled_spans,
            "views_failed": views_failed}


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


def _chunk_stats(run: Run, measured: set[str], names: dict[int, str]) -> tuple:
    """Per-stage FIFO, snapshot and transfer figures and the head-of-line table, from the
    run's chunk span table (all chunk spans, not only those attribution walked)."""
    from omnitrace import spantable as stt
    C = run.chunks
    if C is None or not len(C):
        return [], [], [], [], 0
    ids = np.array([i for i, r in enumerate(run.chunk_requests) if r in measured], np.int64)
    C = C[np.isin(C["req"], ids)]
    dur = C["end"] - C["start"]
    fifo = []
    F = C["name"] == stt.N_FIFO
    for st in np.unique(C["stage"][F]).tolist():
        m = F & (C["stage"] == st)
        d = dur[m]
        res = summary(d, NS_TO_MS)
        blk = summary(np.minimum(C["v2"][m], d), NS_TO_MS)
        depth = C["v1"][m] + 1
        depth = depth[depth >= 0]
        fifo.append({"stage": stage_label(st, names), "stage_id": st, "count": res["count"],
                     "residence_p50_ms": res["p50"], "residence_p99_ms": res["p99"],
                     "residence_max_ms": res["max"], "blocked_p50_ms": blk["p50"],
                     "blocked_p99_ms": blk["p99"],
                     "depth_mean": float(depth.mean()) if len(depth) else None,
                     "depth_max": int(depth.max()) if len(depth) else None,
                     "residence_ms": (d * NS_TO_MS).tolist()})
    snapshot = []
    S = C["name"] == stt.N_SNAPSHOT
    for st in np.unique(C["stage"][S]).tolist():
        sm = summary(dur[S & (C["stage"] == st)], NS_TO_US)
        snapshot.append({"stage": stage_label(st, names), "stage_id": st, "count": sm["count"],
                         "mean_us": sm["mean"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                         "max_us": sm["max"]})
    P, G = C["name"] == stt.N_PUT, C["name"] == stt.N_GET
    producer = np.where(P, C["stage"], C["peer"])
    consumer = np.where(P, C["peer"], C["stage"])
    transfer = []
    pairs = sorted({cv.stage_pair(p, c) for p, c in zip(producer[P | G].tolist(), consumer[P | G].tolist())})
    for pair in pairs:
        p, c = (int(x) for x in pair.split("->"))
        row: dict[str, Any] = {"pair": pair}
        for sel, tag in ((P, "put"), (G, "get")):
            m = sel & (producer == p) & (consumer == c)
            sm = summary(dur[m], NS_TO_US)
            nbytes, total = int(C["v1"][m].sum()), int(dur[m].sum())
            n = int(m.sum())
            row[tag] = {"count": sm["count"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                        "mean_bytes": nbytes / n if n else 0.0,
                        "bandwidth_mb_s": (nbytes / 1e6) / (total / 1e9) if total > 0 else None}
        transfer.append(row)
    # head of line: victim x culprit, blocked time split evenly among listed culprits
    B = F & (C["v2"] > 0) & (C["by0"] > 0)
    hol_rows = []
    if B.any():
        rows = C[B]
        n_by = (rows["by0"] > 0).astype(np.int64) + (rows["by1"] > 0) + (rows["by2"] > 0)
        share = np.minimum(rows["v2"], dur[B]) / n_by * NS_TO_MS
        vic, cul, sh = [], [], []
        for col in ("by0", "by1", "by2"):
            m = rows[col] > 0
            vic.append(rows["req"][m].astype(np.int64))
            cul.append(rows[col][m].astype(np.int64))
            sh.append(share[m])
        vic, cul, sh = np.concatenate(vic), np.concatenate(cul), np.concatenate(sh)
        key = vic * (len(run.chunk_requests) + 1) + cul
        uniq, inv = np.unique(key, return_inverse=True)
        total = np.bincount(inv, weights=sh)
        times = np.bincount(inv)
        reqs = run.chunk_requests
        base = len(reqs) + 1
        hol_rows = [{"victim": reqs[k // base], "culprit": reqs[k % base], "blocked_ms": float(t),
                     "times": int(n)} for k, t, n in zip(uniq.tolist(), total.tolist(), times.tolist())]
        hol_rows.sort(key=lambda r: (-r["blocked_ms"], r["victim"], r["culprit"]))
    return fifo, snapshot, transfer, hol_rows, int(np.count_nonzero(C["reason"]))


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

    # ---- FIFO, snapshot, transfer, head of line over all chunks of measured requests
    fifo, snapshot, transfer, hol_rows, chunk_incomplete = _chunk_stats(run, measured, names)

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
    if recorder["views_failed"]:
        warnings.append(f"the agent's live views failed ({recorder['views_failed']}): live metrics "
                        "and OTLP export stopped there; this report reads the complete record")
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
    incomplete = sum(reqs[r].incomplete for r in measured if r in reqs) + chunk_incomplete
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
                   "spans": run.span_count, "spans_skipped_warmup": run.skipped_spans},
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
