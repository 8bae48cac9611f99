"""What `omnitrace top` shows, computed from two readings of the agent's metrics.

Rates and quantiles are over the interval between the readings (as Prometheus's
``rate`` and ``histogram_quantile`` over that window would give); with one reading, over
the whole run. Quantiles interpolate linearly inside a bucket, as ``histogram_quantile``
does, so they agree with the Grafana panels.
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
    v.culprits = list(views.get("head_of_line_top_culprits", []))
    v.accounting = (cur.agent or {}).get("accounting") or {}
    v.events = cur.total("omnitrace_events_total")
    v.dropped = cur.total("omnitrace_events_dropped_total")
    v.lag_s = cur.total("omnitrace_agent_lag_seconds")
    v.export_lost = sum(x for lab, x in cur.series("omnitrace_agent_export_spans_total").items()
                        if _get(lab, "outcome") in ("failed", "dropped"))
    v.sampled_out = cur.total("omnitrace_agent_spans_sampled_out_total")
    return v
