"""Is a run fit to be compared: what is wrong with its record or its load, one short phrase
each, read from its report (``report.build_report``). `omnitrace compare` and `loadtest
--ab` warn with these and mark every delta against a run that has any: a delta against a
partial, damaged or failed run measures the damage as much as the deployments.
"""
from __future__ import annotations

from typing import Any


# a run stopped by a signal (a server's usual end: Ctrl-C, a kill) has a whole record; what
# its stop cut short shows as failed requests, counted below like any other
CLEAN_STATUSES = (None, "complete", "interrupted", "terminated", "hangup")


def _record(recorder: dict[str, Any]) -> list[str]:
    """Events that are not in the record, by the accounting identity where the run has one."""
    acc = recorder.get("accounting") or {}
    out = []
    if acc.get("known") and not acc.get("live"):
        missing = int(acc["events_written"]) - int(acc["recorded"])
        if missing > 0:
            out.append(f"{missing} of {acc['events_written']} events not in the record")
    elif recorder["dropped"] or recorder["never_drained"] or recorder["not_recorded"]:
        out.append(f"{recorder['dropped'] + recorder['never_drained'] + recorder['not_recorded']} "
                   "events not in the record")
    if acc.get("torn") or recorder["torn_records"]:
        out.append("torn event segment")
    return out


def issues(rep: dict[str, Any]) -> list[str]:
    """Why ``rep``'s run is partial (status, record) or failed (a stage died, every measured
    request failed); empty for a clean run."""
    out = [f"run status {r['status']!r}" for r in rep["run"] if r.get("status") not in CLEAN_STATUSES]
    out += _record(rep["recorder"])
    out += [f"stage {d['stage']} died" for d in rep["failures"]["stage_deaths"]]
    w = rep["window"]
    if w["measured"] and w["failed"] >= w["measured"]:
        out.append(f"every measured request failed ({w['failed']})")
    return out
