"""The report's warnings: a list of rules, each a function of what the report found
(:class:`Facts`) that says zero or more lines. The loudest rules' lines go above the
load's own warnings (missing files, mixed runs, ...), the others below, each list in its
order: adding a warning is adding a rule to one of the lists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Facts:
    """What the rules read."""

    recorder: dict[str, Any]  # the report's "recorder" section (exporters' undelivered set)
    fails: dict[str, Any]  # the report's "failures" section
    attributed: list  # the walk's rows (attributed measured requests)
    requests: list[dict[str, Any]]  # per-request report rows
    has_api: bool
    measured: set[str]
    no_ttfp: list[str]
    untraced: list[str]
    incomplete: int  # request/stage spans of measured requests closed without their end
    chunk_incomplete: dict[str, int]
    in_record: int  # spans the record rebuilds
    repeated_ids: dict[str, int]  # request id -> its arrivals after the first


Rule = Callable[[Facts], list[str]]


def _stage_deaths(f: Facts) -> list[str]:
    return [f"STAGE {d['stage']} DIED during the run (recorded by the API server)"
            for d in reversed(f.fails["stage_deaths"])]


def _delivery_timeouts(f: Facts) -> list[str]:
    by_stage: dict[str, list[dict]] = {}
    for d in f.fails["delivery_timeouts"]:
        by_stage.setdefault(d["stage"], []).append(d)
    return [f"STAGE {stage}: {len(ds)} CONNECTOR DELIVER{'Y' if len(ds) == 1 else 'IES'} TIMED OUT "
            f"(MRv2; vLLM-Omni quarantines the stage's sends), first request {ds[0]['request']} "
            f"chunk {ds[0]['chunk']}" for stage, ds in by_stage.items()]


def _failed(f: Facts) -> list[str]:
    if not f.fails["failed"]:
        return []
    parts = [f"{c['count']} {c['cause']} ("
             + ", ".join(f"{n} {h}" for h, n in sorted(c["how"].items(), key=lambda x: -x[1])) + ")"
             for c in f.fails["causes"]]
    return [f"{f.fails['failed']} measured request(s) FAILED: " + "; ".join(parts)]


def _dropped(f: Facts) -> list[str]:
    if f.recorder["dropped"] <= 0:
        return []
    return [f"RECORDER DROPPED {f.recorder['dropped']} EVENTS: some spans are missing; "
            "attribution of affected requests is incomplete"]


def _accounting(f: Facts) -> list[str]:
    """One warning per place events went other than the record, with the identity's
    figures (the agent's own counters where a run has no accounting)."""
    recorder = f.recorder
    acc = recorder.get("accounting") or {}
    out = []
    if recorder["never_drained"]:
        out.append(f"THE AGENT DIED: {recorder['never_drained']} events were never drained "
                   "from the rings; requests they belong to are incomplete")
    if recorder["not_recorded"]:
        why = acc.get("not_recorded_why") or "max-run-bytes"
        cause = "--max-run-bytes reached" if why == "max-run-bytes" else f"the event log could not be written ({why})"
        out.append(f"{cause}: {recorder['not_recorded']} events were not recorded; requests "
                   "then are missing or incomplete")
    if acc.get("known") and not acc.get("live"):
        if acc["lost"] > 0:
            out.append(f"{acc['lost']} events lost ({acc['lost_why'] or 'cause unknown'}): "
                       "written at hook sites, not in the record")
        if not acc["closes"]:
            out.append(f"THE EVENT ACCOUNTING DOES NOT CLOSE: {acc['headline']}")
    elif acc.get("notes"):
        out.append(f"event accounting unknown: {acc['notes'][0]}")
    elif recorder["torn_records"]:
        out.append(f"{recorder['torn_records']} events lost in a torn event segment")
    return out


def _exporters(f: Facts) -> list[str]:
    return [f"live {kind} exporter did not deliver {c['undelivered']} of the record's "
            f"{f.in_record} spans (failed {c['failed']}, dropped {c['dropped']} (queue full), "
            f"sampled out {c['sampled_out']}, never built live {c['not_built_live']}); "
            "`omnitrace export` can resend them from the record"
            for kind, c in f.recorder["exporters"].items() if c["undelivered"]]


def _outages(f: Facts) -> list[str]:
    return [f"{what} was out of service {when}" for what, when in (f.recorder.get("outages") or {}).items()]


def _views_failed(f: Facts) -> list[str]:
    if not f.recorder["views_failed"]:
        return []
    return [f"the agent's live views failed ({f.recorder['views_failed']}): live metrics "
            "and OTLP export stopped there; this report reads the complete record"]


def _sampled(f: Facts) -> list[str]:
    r = f.recorder
    if not r["requests_not_exported"]:
        return []
    return [f"the live OTLP exporter fell behind and sampled: {r['requests_not_exported']} "
            f"requests ({r['spans_not_exported']} spans) were not exported live"]


def _no_ttfp(f: Facts) -> list[str]:
    if not f.no_ttfp:
        return []
    return [f"{len(f.no_ttfp)} measured request(s) have no first audio packet in the trace "
            "and no recorded failure (cut off or still running): not attributed"]


def _untraced(f: Facts) -> list[str]:
    if not f.untraced:
        return []
    return [f"{len(f.untraced)} measured bench request(s) succeeded but have no trace at all"]


def _repeated_ids(f: Facts) -> list[str]:
    if not f.repeated_ids:
        return []
    ids = sorted(f.repeated_ids, key=lambda r: (-f.repeated_ids[r], r))
    return [f"{len(ids)} request id(s) arrived more than once ("
            + ", ".join(f"{r!r} {f.repeated_ids[r] + 1}x" for r in ids[:3]) + (", ..." if len(ids) > 3 else "")
            + "): the requests of one x-request-id are joined into one trace, their figures "
            "merged; give every request its own id"]


def _nothing_attributed(f: Facts) -> list[str]:
    if not f.has_api and f.measured:
        return ["no API requests in this run (component-level run): per-stage snapshot, FIFO "
                "and transfer figures only, no TTFP attribution"]
    if not f.attributed:
        return ["no measured request could be attributed"]
    return []


def _unrecorded(f: Facts) -> list[str]:
    unrec = sum(len(r["unrecorded_tasks"]) for r in f.requests)
    if not unrec:
        return []
    return [f"{unrec} critical-path hop(s) lack the producing task's own snapshot/FIFO/process "
            "spans (the trace holds only an earlier task under the same chunk index): that "
            "time is counted as the producer's compute"]


def _incomplete(f: Facts) -> list[str]:
    out = []
    if f.incomplete:
        out.append(f"{f.incomplete} request/stage span(s) of measured requests were closed by the agent "
                   "without their end event (omni.incomplete)")
    if f.chunk_incomplete:
        out.append("chunk spans without their end event, left out of every figure: "
                   + ", ".join(f"{n} {k}" for k, n in sorted(f.chunk_incomplete.items())))
    return out


# above the load's own warnings, loudest first
HEAD: tuple[Rule, ...] = (_stage_deaths, _delivery_timeouts, _failed, _dropped, _accounting)
# below them
TAIL: tuple[Rule, ...] = (_exporters, _outages, _views_failed, _sampled, _no_ttfp, _untraced, _repeated_ids,
                          _nothing_attributed, _unrecorded, _incomplete)


def add(warnings: list[str], facts: Facts) -> None:
    """``warnings`` (the load's own) with every rule's lines around them."""
    warnings[:0] = [line for rule in HEAD for line in rule(facts)]
    warnings += [line for rule in TAIL for line in rule(facts)]
