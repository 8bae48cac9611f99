"""What `omnitrace top` shows, computed from two readings of the agent's metrics.

Rates and quantiles are over the interval between the readings (as Prometheus's
``rate`` and ``histogram_quantile`` over that window would give); with one reading, over
the whole run. Quantiles interpolate linearly inside a bucket, as ``histogram_quantile``
does, so they agree with the Grafana panels.

A finished run is shown from its report instead (:func:`from_report`): the whole run, with
the report's exact figures, so `top` and `report` cannot disagree about it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from omnitrace.top.source import Histogram, Labels, Sample

TTFP = "omnitrace_request_ttfp_seconds"
TTFT = "omnitrace_request_ttft_seconds"
FIFO = "omnitrace_fifo_residence_seconds"
FIFO_BLOCKED = "omnitrace_fifo_blocked_seconds"
DEPTH = "omnitrace_fifo_depth"
SNAPSHOT = "omnitrace_snapshot_duration_seconds"


def quantile(q: float, h: Histogram) -> float | None:
    total = h.count
    if total <= 0:
        return None
    rank = q * total
    lower, prev = 0.0, 0.0
    for i, cum in enumerate(h.cumulative):
        if cum >= rank:
            if i >= len(h.bounds):  # +Inf bucket: the highest finite bound, as Prometheus
                return h.bounds[-1] if h.bounds else None
            upper = h.bounds[i]
            in_bucket = cum - prev
            return lower + (upper - lower) * ((rank - prev) / in_bucket if in_bucket else 1.0)
        lower, prev = h.bounds[i] if i < len(h.bounds) else lower, cum
    return h.bounds[-1] if h.bounds else None


def _delta_hist(cur: Histogram, prev: Histogram | None) -> Histogram:
    if prev is None or len(prev.cumulative) != len(cur.cumulative) or prev.count > cur.count:
        return cur
    return Histogram(cur.bounds, [a - b for a, b in zip(cur.cumulative, prev.cumulative)],
                     cur.sum - prev.sum)


def _merge(hists: list[Histogram]) -> Histogram | None:
    hists = [h for h in hists if h.cumulative]
    if not hists:
        return None
    out = Histogram(hists[0].bounds, [0.0] * len(hists[0].cumulative))
    for h in hists:
        if len(h.cumulative) == len(out.cumulative):
            out.cumulative = [a + b for a, b in zip(out.cumulative, h.cumulative)]
            out.sum += h.sum
    return out


def _get(labels: Labels, key: str) -> str:
    return dict(labels).get(key, "")


@dataclass
class View:
    window_s: float
    source: str
    note: str = ""
    whole_run_s: float = 0.0  # a finished run's length, when the view is its whole run
    culprits_note: str = ""  # what the head-of-line leaderboard was summed from, if partial
    started: float = 0.0  # in the window (the whole run when there is no window)
    finished: float = 0.0
    started_per_s: float = 0.0
    finished_per_s: float = 0.0
    failed: float = 0.0
    in_flight: float = 0.0
    ttfp: tuple[float | None, float | None] = (None, None)  # p50, p99 seconds
    ttft: tuple[float | None, float | None] = (None, None)
    attributed: float = 0.0
    # (stage label, category, mean ms per request, share of TTFP)
    attribution: list[tuple[str, str, float, float]] = field(default_factory=list)
    # stage label -> (residence p50 ms, p99 ms, depth p99, blocked share of residence, tasks/s)
    fifo: dict[str, tuple] = field(default_factory=dict)
    snapshot: dict[str, tuple] = field(default_factory=dict)  # stage -> (p50 ms, p99 ms)
    culprits: list[dict] = field(default_factory=list)
    events: float = 0.0
    dropped: float = 0.0
    accounting: dict = field(default_factory=dict)  # agent.json's identity terms, when read
    lag_s: float = 0.0
    export_lost: float = 0.0
    sampled_out: float = 0.0
    history: dict[str, list[float]] = field(default_factory=dict)


def stage_names(s: Sample) -> dict[str, str]:
    names = {"-1": "api"}
    for lab in s.series("omnitrace_stage_info"):
        names[_get(lab, "stage")] = _get(lab, "stage_name") or _get(lab, "stage")
    return names


def build(cur: Sample, prev: Sample | None, source: str) -> View:
    dt = (cur.t - prev.t) if prev is not None and cur.t > prev.t else 0.0
    names = stage_names(cur)

    def label(stage: str) -> str:
        return f"{stage}:{names[stage]}" if stage in names and stage != "-1" else names.get(stage, stage)

    def delta(name: str) -> dict[Labels, float]:
        now = cur.series(name)
        if prev is None or not dt:
            return now
        before = prev.series(name)
        return {k: v - before.get(k, 0.0) for k, v in now.items()}

    def rate(name: str) -> float:
        total = sum(delta(name).values())
        return total / dt if dt else 0.0

    def hist(name: str, **match: str) -> Histogram | None:
        parts = []
        for (n, lab), h in cur.hists.items():
            if n != name or any(_get(lab, k) != v for k, v in match.items()):
                continue
            parts.append(_delta_hist(h, prev.hists.get((n, lab)) if prev is not None and dt else None))
        return _merge(parts)

    v = View(window_s=dt, source=source, note=cur.note)
    v.started = sum(delta("omnitrace_requests_started_total").values())
    v.finished = sum(delta("omnitrace_requests_finished_total").values())
    v.started_per_s = rate("omnitrace_requests_started_total")
    v.finished_per_s = rate("omnitrace_requests_finished_total")
    v.failed = sum(x for lab, x in cur.series("omnitrace_requests_finished_total").items()
                   if _get(lab, "status") != "ok")
    v.in_flight = cur.total("omnitrace_requests_in_flight")
    for attr, name in (("ttfp", TTFP), ("ttft", TTFT)):
        h = hist(name)
        if h is not None:
            setattr(v, attr, (quantile(0.5, h), quantile(0.99, h)))
    attributed = sum(delta("omnitrace_requests_attributed_total").values())
    v.attributed = attributed
    attr = delta("omnitrace_ttfp_attribution_seconds_total")
    total = sum(attr.values())
    if attributed > 0 and total > 0:
        rows = [(label(_get(lab, "stage")), _get(lab, "category"), 1e3 * x / attributed, x / total)
                for lab, x in attr.items() if x > 0]
        v.attribution = sorted(rows, key=lambda r: -r[3])
    stages = sorted({_get(lab, "stage") for (n, lab) in cur.hists if n == FIFO}, key=int)
    for st in stages:
        h, b, d = hist(FIFO, stage=st), hist(FIFO_BLOCKED, stage=st), hist(DEPTH, stage=st)
        if h is None or h.count <= 0:
            continue
        blocked = b.sum / h.sum if b is not None and h.sum > 0 else 0.0
        v.fifo[label(st)] = (1e3 * (quantile(0.5, h) or 0), 1e3 * (quantile(0.99, h) or 0),
                             quantile(0.99, d) if d is not None else None, blocked,
                             h.count / dt if dt else h.count)
    for st in sorted({_get(lab, "stage") for (n, lab) in cur.hists if n == SNAPSHOT}, key=int):
        h = hist(SNAPSHOT, stage=st)
        if h is not None and h.count > 0:
            v.snapshot[label(st)] = (1e3 * (quantile(0.5, h) or 0), 1e3 * (quantile(0.99, h) or 0))
    views = cur.agent.get("views", {}) if cur.agent else {}
    v.culprits = list(views.get("head_of_line_top_culprits", [])) or _culprits_of_gauge(cur)
    v.accounting = (cur.agent or {}).get("accounting") or {}
    v.events = cur.total("omnitrace_events_total")
    v.dropped = cur.total("omnitrace_events_dropped_total")
    v.lag_s = cur.total("omnitrace_agent_lag_seconds")
    v.export_lost = sum(x for lab, x in cur.series("omnitrace_agent_export_spans_total").items()
                        if _get(lab, "outcome") in ("failed", "dropped"))
    v.sampled_out = cur.total("omnitrace_agent_spans_sampled_out_total")
    return v


def _culprits_of_gauge(cur: Sample) -> list[dict]:
    """The endpoint's leaderboard (the agent's live top 10 as a gauge), where agent.json,
    which also counts each culprit's victims, is not at hand (a URL source)."""
    rows = [{"culprit": _get(lab, "culprit"), "blocked_s": x, "victims": None}
            for lab, x in cur.series("omnitrace_head_of_line_culprit_seconds").items() if x > 0]
    return sorted(rows, key=lambda r: -r["blocked_s"])


def from_report(rep: dict, source: str) -> View:
    """A finished run's whole window, from ``omnitrace report``'s dict (the same request
    selection, TTFP quantiles and attribution as the report)."""
    runs = [r for r in rep["run"] if r.get("started_unix_ns") and r.get("ended_unix_ns")]
    length = sum(r["ended_unix_ns"] - r["started_unix_ns"] for r in runs) / 1e9
    status = ", ".join(sorted({str(r.get("status")) for r in rep["run"]})) or "ended"
    w, s = rep["window"], rep["ttfp"]["server_ms"]
    v = View(window_s=0.0, source=source, note=f"run {status}", whole_run_s=length)
    v.started = v.finished = float(w["measured"])
    v.failed = float(w.get("failed", 0))
    if s["count"]:
        v.ttfp = (s["p50"] / 1e3, s["p99"] / 1e3)
    v.attributed = float(w["attributed"])
    v.attribution = [(a["stage"], a["category"], a["mean_ms"], a["share"])
                     for a in sorted(rep["attribution"], key=lambda a: -a["share"])]
    for f in rep["fifo"]:  # depth: the run's maximum; blocked share: not in the report
        v.fifo[f["stage"]] = (f["residence_p50_ms"], f["residence_p99_ms"], f["depth_max"], None,
                              f["count"])
    for x in rep["snapshot"]:
        v.snapshot[x["stage"]] = (x["p50_us"] / 1e3, x["p99_us"] / 1e3)
    per: dict[str, list] = {}
    for h in rep["head_of_line"]:  # the report's table summed per culprit
        c = per.setdefault(h["culprit"], [0.0, set()])
        c[0] += h["blocked_ms"] / 1e3
        c[1].add(h["victim"])
    v.culprits = [{"culprit": k, "blocked_s": b, "victims": len(vs)}
                  for k, (b, vs) in sorted(per.items(), key=lambda kv: -kv[1][0])]
    if rep["head_of_line_pairs"] > len(rep["head_of_line"]):
        v.culprits_note = (f"summed over the report's {len(rep['head_of_line'])} largest of "
                           f"{rep['head_of_line_pairs']} pairs")
    rec = rep["recorder"]
    v.events, v.dropped = float(rec.get("events") or 0), float(rec.get("dropped") or 0)
    acc = rec.get("accounting") or {}
    if acc.get("known"):
        v.accounting = {"events_written": acc["events_written"], "recorded": acc["recorded"],
                        "dropped_in_rings": acc["dropped_in_rings"], "not_drained_yet": acc["never_drained"],
                        "in_flight": 0, "not_recorded": acc["not_recorded"]}
    return v
