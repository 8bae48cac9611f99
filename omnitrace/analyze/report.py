"""Transform: a loaded run -> one JSON-able report dict (console, --json and HTML read it)."""
from __future__ import annotations

import dataclasses
import functools
import gc
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from omnitrace import __version__
from omnitrace import conventions as cv
from omnitrace import rowops
from omnitrace.analyze import accounting
from omnitrace.rules import attribution as at
from omnitrace.analyze import components, failures, observed, report_warnings, waterfall
from omnitrace.analyze.beside import MIN_WORK, Beside
from omnitrace.analyze.chunkspans import attach_chunks, chunk_rows, request_objects
from omnitrace.analyze.tables import EARLY_DTYPE
from omnitrace.analyze.run import Run
from omnitrace.analyze.select import Selection
from omnitrace.analyze.stats import NS_TO_MS, median, summary
from omnitrace.rules import headofline, walk
from omnitrace.rules.requesttable import RequestTable

WATERFALLS = 10  # slowest requests given a waterfall in the HTML (and --request ID ones)
TOP_CATEGORIES = 4  # per-request console line: the largest categories
MAX_HOL_PAIRS = 1000  # head-of-line victim x culprit pairs kept in the report (the largest)
HOL_NOTE = ("blocked_ms: wall time before the victim's first packet during which at least one of "
            "its critical-path chunks waited in a FIFO while the sender worked on the culprit's "
            "task (union over chunks: never more than the victim's TTFP); chunk_time_sum_ms: the "
            "same waits added per chunk (overlaps counted once per chunk)")


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
    outages = _outages(run)
    never = sum(int(r.get("events_never_drained", 0) or 0) for r in run.run_json)
    acc = None
    if run.ledger is not None:  # the identity's figures replace the agent's (maybe stale) ones
        led = run.ledger
        acc = led.to_dict() | {"headline": accounting.headline(led)}
        if led.known and not led.live:
            dropped, never, not_recorded = led.dropped_in_rings, led.never_drained, led.not_recorded
    return {"known": known, "events": events, "dropped": dropped, "spans_built": spans,
            "rings_with_drops": rings, "never_drained": never, "not_recorded": not_recorded,
            "torn_records": run.torn_records, "accounting": acc, "exporters": exporters,
            "requests_not_exported": sampled_reqs, "spans_not_exported": sampled_spans,
            "views_failed": views_failed, "outages": outages}


def _outages(run: Run) -> dict[str, str]:
    """What was out of service when, by what: the event log (a full disk) and each OTLP
    span exporter, from every agent's counters (those that died included: run.json)."""
    from omnitrace.outages import describe
    spans: dict[str, list] = {}
    start = None
    for rj, a in zip(run.run_json + [{}] * len(run.agent), run.agent):
        start = start or rj.get("started_unix_ns")
        records = [a.get("record")] + [r.get("record") for r in rj.get("agent_restarts") or ()
                                       if isinstance(r, dict)]
        for rec in (r for r in records if isinstance(r, dict)):
            spans.setdefault("event log", []).extend(rec.get("outages") or ())
        exported = [{k: (c.get("outages") if isinstance(c, dict) else None)
                     for k, c in (a.get("exporters") or {}).items()}]
        exported += [r.get("exporter_outages") or {} for r in rj.get("agent_restarts") or () if isinstance(r, dict)]
        for by_kind in exported:
            for kind, got in by_kind.items():
                spans.setdefault(f"{kind} export", []).extend(got or ())
    units = {"event log": "events not recorded"}
    texts = {what: describe(sorted(s, key=lambda x: x[0] if isinstance(x, list) and x else 0), start,
                            units.get(what, "spans not delivered"))
             for what, s in spans.items()}
    return {what: t for what, t in texts.items() if t}


def _undelivered(c: dict[str, Any], in_record: int, sampled_out: int) -> None:
    """A live exporter's spans not delivered, by cause, against the spans the record
    rebuilds: failed, dropped (queue full), sampled out, and the rest never built live (the
    views skipped or stopped); what the agent cannot count live, the record shows."""
    c["sampled_out"] = sampled_out
    c["undelivered"] = max(0, in_record - c["exported"])
    c["not_built_live"] = max(0, c["undelivered"] - c["failed"] - c["dropped"] - sampled_out)


def _first_seen(run: Run, rt: RequestTable) -> dict[str, int]:
    """Request id -> its arrival, or (no API request) its first chunk span's start."""
    nums = np.flatnonzero(rt.has_request)
    out = dict(zip([run.chunk_requests[i] for i in nums.tolist()], rt.arrival[nums].tolist()))
    if run.figures is not None:
        first = run.figures.first_start
        for i in np.flatnonzero(first[:len(run.chunk_requests)] != np.iinfo(np.int64).max).tolist():
            rid = run.chunk_requests[i]
            if i and rid not in out:
                out[rid] = int(first[i])
    return out


def _measured(run: Run, first_seen: dict[str, int], level: int | None,
              sel: Selection) -> tuple[set[str], str, dict[str, dict]]:
    """Ids of measured (non-warm-up) requests, how they were chosen, and bench rows by id."""
    b = run.bench
    rows: dict[str, dict] = {}
    if not b:
        if sel.active:
            return sel.apply(first_seen), f"no bench.json: {sel.describe()}", rows
        run.warnings.append("no bench.json: every traced request is analysed (warm-up not excluded; "
                            "select with --requests PREFIX, --window START:END, --warmup N)")
        return set(first_seen), "all traced requests (no bench.json)", rows
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
    how = "bench.json request ids (warm-up excluded)"
    if sel.active:
        measured &= sel.apply({i: first_seen.get(i, int(rows[i].get("start_unix_ns") or 0))
                               for i in measured})
        how += f"; {sel.describe()}"
    hit = measured & set(first_seen)
    if hit or not measured:
        return measured, how, rows
    windows = [w for w in (b.get("levels") or []) if isinstance(w, dict) and w.get("measured_window")]
    if windows:
        picked: set[str] = set()
        for lv in windows:
            mw = lv["measured_window"]
            lo, hi = int(mw.get("start_unix_ns", 0)), int(mw.get("end_unix_ns", 0))
            picked |= {rid for rid, t in first_seen.items() if lo <= t <= hi}
        run.warnings.append("bench.json request ids not found in the traces: measured window "
                            "selected by time instead")
        return picked, "bench.json measured window (by time)", rows
    return measured, how, rows


def measured_ids(run: Run, level: int | None = None, select: Selection | None = None) -> set[str]:
    """The request ids a report on ``run`` measures (for `compare`'s component figures)."""
    return _measured(run, _first_seen(run, run.request_table()), level, select or Selection())[0]


def build_report(run: Run, per_request_segments: bool = True, level: int | None = None,
                 select: Selection | None = None, waterfalls: int = WATERFALLS,
                 waterfall_ids: list[str] | None = None, consume: bool = False) -> dict[str, Any]:
    """The report of ``run`` (the JSON's shape). Without ``per_request_segments`` only the
    rows of the ``waterfalls`` slowest requests carry their critical path (``segments``).
    ``consume``: the caller reads nothing of ``run`` after this, so its figure tables are let
    go once the component figures are made (an hour's run: ~1 GB, before the rows are)."""
    was = gc.isenabled()
    gc.disable()  # as in load_run: many small acyclic objects
    try:
        return _build_report(run, per_request_segments, level, select or Selection(), waterfalls,
                             list(waterfall_ids or ()), consume)
    finally:
        if was:
            gc.enable()


def _bench_settings(run: Run) -> dict[str, Any] | None:
    """The load's settings, for `compare` (which warns when two sides differ)."""
    b = run.bench
    if not b or not isinstance(b.get("args"), dict):
        return None
    keep = ("concurrency", "num_prompts", "warmup", "input_len", "output_len", "range_ratio",
            "request_rate", "burstiness", "model", "backend", "endpoint", "extra_body")
    out = {k: b["args"].get(k) for k in keep if k in b["args"]}
    # the gaps' shape only where there are gaps and they are not Poisson (the default), so
    # a closed loop against a Poisson one differs in its rate alone
    if out.get("request_rate") is None or out.get("burstiness") == 1.0:
        out.pop("burstiness", None)
    return out


def _victims(run: Run, found: list[tuple[str, int, int, list]]) -> list[headofline.Victim]:
    """Head-of-line victims of the attributed (rid, arrival, first packet, hops)."""
    cidx = run.chunk_index()
    return [headofline.Victim(cidx[rid], a, t, hops) for rid, a, t, hops in found if rid in cidx]


@dataclass
class _RowContext:
    """What a request's report row needs besides its attribution."""

    bench_rows: dict[str, dict[str, Any]]
    label: Callable[[int], str]
    per_request_segments: bool
    waterfalls: int
    waterfall_ids: set[str]
    fifo: tuple[np.ndarray, np.ndarray] | None = None  # headofline.fifo_by_hop of the early rows


@dataclass
class _Totals:
    """Each attributed request's time per (stage, category) as columns: the request's
    place among the walk's rows, the stage, the category (its index in ``at.CATEGORIES``)
    and the ns (an hour's run: ~15M; as a dict per request they were most of the
    aggregate's time and of the child's pickled result)."""

    row: np.ndarray
    stage: np.ndarray
    cat: np.ndarray
    ns: np.ndarray

    @staticmethod
    def of(*cols: Any) -> "_Totals":
        return _Totals(*(np.asarray(c, np.int64) for c in cols))

    @staticmethod
    def of_dicts(totals: list[dict[tuple[int, str], int]]) -> "_Totals":
        """From ``Attribution.totals`` of each row in turn."""
        items = [(i, s, CAT_INDEX[c], v) for i, t in enumerate(totals) for (s, c), v in t.items()]
        return _Totals.of(*(zip(*items) if items else ((), (), (), ())))

    def then(self, rows: int, later: "_Totals") -> "_Totals":
        """These, then ``later`` (its rows after these ``rows``)."""
        return _Totals(np.concatenate((self.row, later.row + rows)),
                       *(np.concatenate((getattr(self, f), getattr(later, f))) for f in ("stage", "cat", "ns")))


CAT_INDEX = {c: i for i, c in enumerate(at.CATEGORIES)}


@dataclass
class _Walked:
    """The walk of some requests, as the report reads it: per attributed request (in walk
    order) its report row, TTFP and category totals; the attributions that may get a
    waterfall (``kept``); the ids without a first packet; the head-of-line pairs and
    their victims' request indexes (``hp``'s victim indexes: this list)."""

    rows: list[dict[str, Any]]
    ttfp_ns: list[int]
    totals: _Totals
    kept: list[at.Attribution]
    none: list[str]
    hp: headofline.Pairs
    victim_req: list[int]

    def extend(self, later: "_Walked") -> None:
        """Append the walk of the requests after these."""
        self.totals = self.totals.then(len(self.rows), later.totals)
        self.rows += later.rows
        self.ttfp_ns += later.ttfp_ns
        self.kept += later.kept
        self.none += later.none
        self.hp = headofline.joined([self.hp, later.hp])
        self.victim_req += later.victim_req


class _Labels(dict):
    """stage -> its label, made once per stage: a long run looks labels up millions of
    times (a dict hit, no Python call)."""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names = names

    def __missing__(self, stage: int) -> str:
        v = self[stage] = stage_label(stage, self.names)
        return v


def _row(rid: str, ttfp_ns: int, client: Any, sum_ns: int, categories_ms: dict[str, float],
         hops: list[tuple[int, int, int]], missing: list[str], stale: list[tuple[int, int, int]]
         ) -> dict[str, Any]:
    """A request's report row (``segments`` added by the caller when asked for)."""
    return {
        "id": rid,
        "ttfp_ms": ttfp_ns * NS_TO_MS,
        "client_ttfp_ms": client * 1e3 if isinstance(client, (int, float)) and client > 0 else None,
        "sum_error_ns": sum_ns - ttfp_ns,
        "categories_ms": categories_ms,
        "hops": [f"{p}->{c}#{k}" for p, c, k in hops],
        "missing_spans": missing,
        "unrecorded_tasks": [f"{p}->{c}#{k}" for p, c, k in stale],
    }


def _request_row(a: at.Attribution, tot: dict[tuple[int, str], int], client: Any,
                 label: Callable[[int], str], per_request_segments: bool) -> dict[str, Any]:
    row = _row(a.rid, a.ttfp_ns, client, sum(tot.values()),
               {f"{label(s)}/{c}": v * NS_TO_MS for (s, c), v in sorted(tot.items())},
               a.hops, a.missing, a.unrecorded_tasks)
    if per_request_segments:
        row["segments"] = _segments(a, label)
    return row


def _segments(a: at.Attribution, label: Callable[[int], str]) -> list[tuple[Any, ...]]:
    """A request row's critical path: (start ms after arrival, ms, stage, category, detail),
    each a JSON array (tuples: an hour's run has millions, made, pickled and read back)."""
    arrival = a.arrival
    # (end - start): g.dur, without a property call per segment
    return [((g.start - arrival) * NS_TO_MS, (g.end - g.start) * NS_TO_MS, label(g.stage),
             g.category, g.detail) for g in a.segments]


WALK_BATCH = 8192  # requests walked at once (rules/walk.py: fewer than 2^16)


def _walk(run: Run, rt: RequestTable, rids: list[str], ctx: _RowContext) -> _Walked:
    """Attribute ``rids`` and make their report rows and head-of-line pairs (:func:`_walk_parts`)."""
    parts = _walk_parts(run, rt, rids, ctx)
    w = next(parts)
    for p in parts:
        w.extend(p)
    return w


def _walk_parts(run: Run, rt: RequestTable, rids: list[str], ctx: _RowContext
                ) -> Iterator[_Walked]:
    """:func:`_walk`'s result in parts: each batch's rows, as soon as it is walked (a batch at
    a time: rules/walk.py; the reference walk for a batch whose numbers its keys do not
    hold), then the attributions that may get a waterfall and the wall-time head-of-line
    blocking."""
    # per attributed request, in walk order: (rid, arrival, first packet, hops), its TTFP,
    # and how to make its Attribution (few are: the waterfalls')
    found: list[tuple[str, int, int, list]] = []
    ttfp: list[int] = []
    attribution: list[Callable[[], at.Attribution]] = []
    for part, nums, chunks, counts in chunk_rows(run, rids, WALK_BATCH):
        w = _Walked([], [], _Totals.of((), (), (), ()), [], [], headofline.Pairs.unblocked(0), [])
        if walk.fits(chunks):
            wk = walk.walk(part, rt, nums, chunks, np.repeat(np.arange(len(part)), counts))
            ok = np.flatnonzero(wk.ok).tolist()
            w.none = [part[i] for i in np.flatnonzero(~wk.ok).tolist()]
            found += zip([wk.rids[i] for i in ok], wk.arrival[ok].tolist(), wk.ttfp[ok].tolist(),
                         [wk.hops[i] for i in ok])
            attribution += [functools.partial(wk.attribution, i) for i in ok]
            w.ttfp_ns = (wk.ttfp - wk.arrival)[ok].tolist()
            w.rows, w.totals = _batch_rows(wk, ok, ctx)
        else:
            totals = []
            for r in attach_chunks(run, request_objects(run, nums), part, chunks, counts):
                a = at.attribute(r)
                if a is None:
                    w.none.append(r.rid)
                    continue
                found.append((a.rid, a.arrival, a.ttfp, a.hops))
                attribution.append(lambda a=a: a)
                tot = a.totals()
                totals.append(tot)
                w.ttfp_ns.append(a.ttfp_ns)
                w.rows.append(_request_row(a, tot, ctx.bench_rows.get(a.rid, {}).get("ttfp_s"), ctx.label,
                                           ctx.per_request_segments))
            w.totals = _Totals.of_dicts(totals)
        ttfp += w.ttfp_ns
        yield w
    # the slowest (stable order) and those asked for: the whole report's waterfalls are
    # among each part's own (none is preceded by more than n in its part)
    order = sorted(range(len(found)), key=lambda i: -ttfp[i])
    kept = set(order[:ctx.waterfalls]) | {k for k, f in enumerate(found) if f[0] in ctx.waterfall_ids}
    # the victims' waits are among the chunk spans begun before their first packet
    early = run.early if run.early is not None else np.zeros(0, EARLY_DTYPE)
    victims = _victims(run, found)
    yield _Walked([], [], _Totals.of((), (), (), ()), [attribution[k]() for k in sorted(kept)], [],
                  headofline.blocked_pairs(victims, early, run.busy, ctx.fifo), [v.req for v in victims])


def _batch_rows(wk: walk.Walked, ok: list[int], ctx: _RowContext) -> tuple[list[dict[str, Any]], _Totals]:
    """:func:`_request_row` and ``Attribution.totals`` of the attributed requests ``ok``
    of a batch walk, from its arrays (no Segment object per segment)."""
    n = len(wk.rids)
    req = np.repeat(np.arange(n), np.diff(wk.seg_lo))
    dur = wk.seg_end - wk.seg_start
    # per (request, stage, category) sums, in the order the row lists them (stage, name)
    o = np.lexsort((_NAME_RANK[wk.seg_cat], wk.seg_stage, req))
    g_req, g_stage, g_cat = req[o], wk.seg_stage[o], wk.seg_cat[o]
    head = np.ones(len(o), bool)
    head[1:] = (g_req[1:] != g_req[:-1]) | (g_stage[1:] != g_stage[:-1]) | (g_cat[1:] != g_cat[:-1])
    lo = np.flatnonzero(head)
    sums = np.add.reduceat(dur[o], lo) if len(lo) else np.zeros(0, np.int64)
    names = _objects(g_stage[lo] * len(at.CATEGORIES) + g_cat[lo],
                     lambda k: f"{ctx.label(k // len(at.CATEGORIES))}/{at.CATEGORIES[k % len(at.CATEGORIES)]}")
    ms = (sums * NS_TO_MS).tolist()
    g_lo = np.searchsorted(g_req[lo], np.arange(n + 1)).tolist()
    cum = np.concatenate(([0], np.cumsum(dur)))
    sum_ns = (cum[wk.seg_lo[1:]] - cum[wk.seg_lo[:-1]]).tolist()
    ttfp = (wk.ttfp - wk.arrival).tolist()
    segs = _segment_lists(wk, req, dur, ctx.label) if ctx.per_request_segments else None
    s_lo = wk.seg_lo.tolist()
    rows = []
    for i in ok:
        a, b = g_lo[i], g_lo[i + 1]
        rid = wk.rids[i]
        row = _row(rid, ttfp[i], ctx.bench_rows.get(rid, {}).get("ttfp_s"), sum_ns[i],
                   dict(zip(names[a:b], ms[a:b])), wk.hops[i], wk.missing[i], wk.stale[i])
        if segs is not None:
            row["segments"] = segs[s_lo[i]:s_lo[i + 1]]
        rows.append(row)
    # the totals of the rows (``ok``'s places), by row
    place = np.full(n, -1, np.int64)
    place[ok] = np.arange(len(ok))
    mine = place[g_req[lo]] >= 0
    return rows, _Totals.of(place[g_req[lo]][mine], g_stage[lo][mine], g_cat[lo][mine], sums[mine])


def _objects(codes: np.ndarray, make: Callable[[int], Any]) -> list[Any]:
    """``make(code)`` of each code, made once per distinct code (codes in a small range:
    one per code of the range, a lookup table; else per distinct code, by a sort)."""
    if not len(codes):
        return []
    lo, hi = int(codes.min()), int(codes.max())
    if hi - lo < 1 << 16:
        made, at_ = [make(c) for c in range(lo, hi + 1)], codes.astype(np.int64) - lo
    else:
        uniq, at_ = np.unique(codes, return_inverse=True)
        made = [make(c) for c in uniq.tolist()]
    return np.array(made + [None], object)[:-1][at_].tolist()


def _segment_lists(wk: walk.Walked, req: np.ndarray, dur: np.ndarray, label: Callable[[int], str]
                   ) -> list[tuple[Any, ...]]:
    """Every segment of a batch walk as its row's (start ms after arrival, ms, stage,
    category, detail) (:func:`_segments`)."""
    return list(zip(((wk.seg_start - wk.arrival[req]) * NS_TO_MS).tolist(), (dur * NS_TO_MS).tolist(),
                    _objects(wk.seg_stage, label), _objects(wk.seg_cat, at.CATEGORIES.__getitem__),
                    _objects(wk.seg_detail, walk.DETAILS.__getitem__)))


# each category's place in name order (a row lists its categories sorted by (stage, name))
_NAME_RANK = np.argsort(np.argsort(np.array(at.CATEGORIES)))


def _walk_packed(run: Run, rt: RequestTable, rids: list[str], ctx: _RowContext
                 ) -> Iterator[_Walked]:
    """:func:`_walk_parts` in a child: its kept attributions as tuples
    (``Attribution.packed``: pickling dataclasses cost ~3x; :func:`_unpacked` undoes it)."""
    for w in _walk_parts(run, rt, rids, ctx):
        w.kept = [a.packed() for a in w.kept]
        yield w


def _no_figures(run: Run) -> None:
    """Let go of ``run``'s figure tables (read only by the component figures)."""
    run.figures = None


def _unpacked(w: _Walked) -> _Walked:
    w.kept = [at.Attribution.unpacked(a) for a in w.kept]
    return w


# CPU seconds per request walked here (with its report row and head-of-line pairs), per
# request walked by the child (that, pickled; sent) and per figure-table row summarised, as
# measured on a 49M-event run (2-core VM, both processes busy; benchmarks/agent_results.md):
# they split the work so that this process (figures, then its share of the walk) and the
# child finish together.
WALK_S, WALK_BESIDE_S, FIGURE_ROW_S = 1.2e-4, 1.45e-4, 5.5e-8


def _walk_here(requests: int, figure_rows: int) -> int:
    """How many of ``requests`` this process walks beside the component figures of
    ``figure_rows``; a forked child walks the rest (none when the work is small)."""
    if requests < MIN_WORK:
        return requests
    here = (requests * WALK_BESIDE_S - figure_rows * FIGURE_ROW_S) / (WALK_S + WALK_BESIDE_S)
    return int(min(max(here, 0.0), requests / 2 + requests / 4))


def _aggregate(w: _Walked, label: Callable[[int], str]) -> list[dict[str, Any]]:
    """Per stage and category over the attributed requests, zeros included so the means
    add up to the mean TTFP."""
    t, n = w.totals, len(w.ttfp_ns)
    width = len(at.CATEGORIES)
    codes, inv = np.unique(t.stage * width + t.cat, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    lo = np.searchsorted(inv[order], np.arange(len(codes) + 1)).tolist()
    keys = sorted(range(len(codes)), key=lambda j: (int(codes[j] // width) if codes[j] >= 0 else 99,
                                                    int(codes[j] % width)))
    mean_ttfp = sum(w.ttfp_ns) / len(w.ttfp_ns) if w.ttfp_ns else 0.0
    agg = []
    for j in keys:
        stage, cat = int(codes[j] // width), at.CATEGORIES[int(codes[j] % width)]
        values = np.zeros(n)  # a row without the key: 0
        mine = order[lo[j]:lo[j + 1]]
        values[t.row[mine]] = t.ns[mine]
        s = summary(values, NS_TO_MS)
        agg.append({"stage": label(stage), "stage_id": stage, "category": cat,
                    "mean_ms": s["mean"], "p50_ms": s["p50"], "p99_ms": s["p99"],
                    "share": (s["mean"] / (mean_ttfp * NS_TO_MS)) if mean_ttfp else 0.0})
    return agg


def _head_of_line(run: Run, w: _Walked, requests: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], int, list[dict[str, Any]]]:
    """The largest (victim, culprit) pairs as rows, how many pairs there are, the victims."""
    hp = w.hp
    ttfp_of = {r["id"]: r["ttfp_ms"] for r in requests}
    blocked = np.flatnonzero(hp.wall > 0)
    ids = [run.chunk_requests[i] for i in np.array(w.victim_req, np.int64)[blocked].tolist()]
    hol_victims = [{"victim": vid, "ttfp_ms": ttfp_of[vid], "blocked_ms": ms, "chunk_time_sum_ms": sum_ms,
                    "culprits": n}
                   for vid, ms, sum_ms, n in zip(ids, (hp.wall[blocked] * NS_TO_MS).tolist(),
                                                 (hp.chunk_ns[blocked] * NS_TO_MS).tolist(),
                                                 hp.culprits[blocked].tolist())]
    hol_victims.sort(key=lambda r: (-r["blocked_ms"], r["victim"]))
    hol_pairs = len(hp.victim)
    return _top_pairs(run, w, ttfp_of) if hol_pairs else [], hol_pairs, hol_victims


def _top_pairs(run: Run, w: _Walked, ttfp_of: dict[str, float]) -> list[dict[str, Any]]:
    """The largest (victim, culprit) pairs (by blocked ms, then victim and culprit id) as
    rows: a long run has millions of pairs, so only those that may rank among the first
    MAX_HOL_PAIRS by blocked ms are sorted, and only their ids ranked."""
    hp = w.hp
    key = -(hp.pair_wall * NS_TO_MS)
    if len(key) > MAX_HOL_PAIRS:
        cand = np.flatnonzero(key <= np.partition(key, MAX_HOL_PAIRS - 1)[MAX_HOL_PAIRS - 1])
    else:
        cand = np.arange(len(key))
    vreq = np.array(w.victim_req, np.int64)[hp.victim[cand]]
    culprit = hp.culprit[cand].astype(np.int64)
    idx = np.unique(np.concatenate((vreq, culprit)))  # the ids' string order among these
    names = [run.chunk_requests[i] for i in idx.tolist()]
    rank = np.empty(len(idx), np.int64)
    rank[sorted(range(len(idx)), key=names.__getitem__)] = np.arange(len(idx))
    top = np.lexsort((rank[np.searchsorted(idx, culprit)], rank[np.searchsorted(idx, vreq)], key[cand]))
    rows = []
    for j in top[:MAX_HOL_PAIRS].tolist():
        vid, p = run.chunk_requests[int(vreq[j])], int(cand[j])
        rows.append({"victim": vid, "culprit": run.chunk_requests[int(culprit[j])],
                     "blocked_ms": float(hp.pair_wall[p]) * NS_TO_MS,
                     "chunk_time_sum_ms": int(hp.pair_chunk[p]) * NS_TO_MS,
                     "tasks": int(hp.pair_tasks[p]), "victim_ttfp_ms": ttfp_of[vid]})
    return rows


def _waterfalls(run: Run, rt: RequestTable, w: _Walked, requests: list[dict[str, Any]],
                label: Callable[[int], str], per_request_segments: bool, wf_ids: list[str],
                n_waterfalls: int, warnings: list[str]) -> list[dict[str, Any]]:
    """The waterfalls of ``wf_ids`` (the slowest and those asked for); the slowest rows
    get their critical path when the report does not give every row one."""
    cidx = run.chunk_index()
    early = run.early if run.early is not None else np.zeros(0, EARLY_DTYPE)
    by_rid = {a.rid: a for a in w.kept}
    wfs = []
    row_of = {r["id"]: r for r in requests[:n_waterfalls]} if not per_request_segments else {}
    rows_of = _early_rows(early, [cidx[rid] for rid in wf_ids if rid in by_rid and rid in cidx])
    for rid in dict.fromkeys(wf_ids):
        a = by_rid.get(rid)
        if a is None:
            warnings.append(f"--request {rid}: not an attributed measured request (no waterfall)")
            continue
        if rid in row_of:  # the HTML draws the critical paths of the rows that have them
            row_of[rid]["segments"] = _segments(a, label)
        i = cidx.get(rid, -1)
        # its rows in time order (not feed order: the same whatever the segments)
        mine = rows_of.get(i, early[:0])
        mine = rowops.take(mine, np.lexsort((mine["chunk"], mine["stage"], mine["name"], mine["start"])))
        visits = waterfall.Visits(rt.stages.of_request(i), rt.queues.of_request(i))
        wfs.append(waterfall.build(a, visits, mine, run.busy, run.chunk_requests, label, i))

    return wfs


def _early_rows(early: np.ndarray, wanted: list[int]) -> dict[int, np.ndarray]:
    """The early rows of each request index ``wanted``, in table order, picked out by one
    pass over the table (a pass per request took seconds on a long run; sorting them all, more)."""
    if not wanted:
        return {}
    mine = rowops.select(early, np.isin(early["req"], wanted, kind="table"))
    return {i: rowops.select(mine, mine["req"] == i) for i in set(wanted)}


def _failures(run: Run, rt: RequestTable, measured: set[str], bench_rows: dict[str, Any],
              names: dict[int, str]) -> dict[str, Any]:
    """Failed measured requests by cause (``failures.summarize``)."""
    def died_label(stage: int) -> str:
        return f"{stage} ({names[stage]})" if stage in names else str(stage)

    cidx = run.chunk_index()
    traced = [(rid, cidx.get(rid, 0)) for rid in measured if rid not in bench_rows]
    traced_status = {rid: (int(rt.status[i]), int(rt.end[i])) for rid, i in traced if rt.has_request[i]}
    return failures.summarize((bench_rows[i] for i in sorted(measured & set(bench_rows))), traced_status,
                              run.stage_deaths, died_label, run.delivery_timeouts)


def _components(run: Run, measured: set[str], label: Callable[[int], str]) -> tuple[Any, Any, Any, Any]:
    """FIFO, snapshot and transfer figures over every chunk of the measured requests, and
    the chunk spans among them that are incomplete."""
    rows = components.Rows(run.figures, run.chunk_requests, measured)
    return (*components.figures(rows, label), components.incomplete(rows))


def _exporter_losses(run: Run, recorder: dict[str, Any]) -> int:
    """Each live exporter's spans that never reached its endpoint, set on its counters;
    returns the spans in the record (what every exporter was given)."""
    in_record = run.span_count + run.skipped_spans
    for c in recorder["exporters"].values():
        _undelivered(c, in_record, recorder["spans_not_exported"])
    return in_record


def _ttfp(w: _Walked, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Server and client TTFP, their difference, and how exactly the categories sum to it."""
    server = [t * NS_TO_MS for t in w.ttfp_ns]  # walk order (a float mean depends on it)
    client = [r["client_ttfp_ms"] for r in requests if r["client_ttfp_ms"] is not None]
    diffs = [r["client_ttfp_ms"] - r["ttfp_ms"] for r in requests if r["client_ttfp_ms"] is not None]
    sum_err = [abs(r["sum_error_ns"]) for r in requests]
    return {"server_ms": summary(server), "client_ms": summary(client),
            "client_minus_server_median_ms": median(diffs), "client_minus_server_ms": summary(diffs),
            "sum_error_max_ns": max(sum_err) if sum_err else None}


def _walk_and_figures(run: Run, rt: RequestTable, walked: list[str], ctx: _RowContext,
                      measured: set[str], consume: bool) -> tuple[_Walked, tuple[Any, Any, Any, Any]]:
    """The walk of ``walked`` and the component figures (:func:`_components`). A long run: a
    forked child walks the later requests while this process computes the component
    figures and walks the first ones (the child never reads the figure tables: its copy
    lets go of them at once; ``consume``: so does this process once it has the figures)."""
    k = _walk_here(len(walked), sum(len(t) for t in run.figures.tables()) if run.figures else 0)
    if k < len(walked) and run.early is not None:  # made once, for both processes
        ctx = dataclasses.replace(ctx, fifo=headofline.fifo_by_hop(run.early))
    later = (Beside(_walk_packed, run, rt, walked[k:], ctx, parts=True,
                    release=functools.partial(_no_figures, run)) if k < len(walked) else None)
    # ---- components: FIFO, snapshot, transfer over all chunks of measured requests
    figures = _components(run, measured, ctx.label)
    if consume:
        _no_figures(run)
    w = _walk(run, rt, walked[:k], ctx)
    if later is not None:
        for part in later.result():
            w.extend(_unpacked(part))
    return w, figures


def _build_report(run: Run, per_request_segments: bool, level: int | None, sel: Selection,
                  n_waterfalls: int, waterfall_ids: list[str], consume: bool) -> dict[str, Any]:
    rt = run.request_table()
    names = run.stage_names
    label = _Labels(names).__getitem__
    first_seen = _first_seen(run, rt)
    measured, how, bench_rows = _measured(run, first_seen, level, sel)
    recorder = _agent_counters(run)
    has_api = bool(rt.has_request.any())
    bench_measured = measured & set(bench_rows)
    fails = _failures(run, rt, measured, bench_rows, names)  # before anything is called missing
    failed_ids = set(fails.pop("failed_ids"))

    # requests without an API request (component-level run) or without a trace: counted below
    cidx = run.chunk_index()
    measured_nums = [cidx.get(rid, 0) for rid in sorted(measured)]
    walked = [rid for rid, i in zip(sorted(measured), measured_nums) if rt.has_request[i]]
    ctx = _RowContext(bench_rows, label, per_request_segments, n_waterfalls, set(waterfall_ids))
    w, (fifo, snapshot, transfer, chunk_incomplete) = _walk_and_figures(run, rt, walked, ctx, measured,
                                                                        consume)
    no_ttfp = [rid for rid in w.none if rid not in failed_ids]
    traced = set(first_seen)
    untraced = sorted(i for i in bench_measured - traced if i not in failed_ids)

    # ---- per request, slowest first
    requests = [w.rows[i] for i in sorted(range(len(w.rows)), key=lambda i: -w.ttfp_ns[i])]
    agg = _aggregate(w, label)
    unseen = observed.not_observed(requests, label)

    # ---- head of line, in wall time, over the critical-path chunks of attributed requests
    hol_rows, hol_pairs, hol_victims = _head_of_line(run, w, requests)

    # ---- waterfalls: the slowest N and any asked for by id
    warnings = list(run.warnings) + observed.lines(unseen)
    wfs = _waterfalls(run, rt, w, requests, label, per_request_segments,
                      [r["id"] for r in requests[:n_waterfalls]] + list(waterfall_ids), n_waterfalls, warnings)

    in_record = _exporter_losses(run, recorder)
    report_warnings.add(warnings, report_warnings.Facts(
        recorder, fails, w.rows, requests, has_api, measured, no_ttfp, untraced,
        int(rt.incomplete[measured_nums].sum()), chunk_incomplete, in_record,
        run.repeated_ids))
    return {
        "omnitrace_version": __version__,
        "runs": [{"path": p} for p in run.paths],
        "run": [{k: rj.get(k) for k in ("run_id", "status", "command", "host", "started_unix_ns",
                                          "ended_unix_ns", "exit_code")} for rj in run.run_json],
        "bench": _bench_settings(run),
        "warnings": warnings,
        "recorder": recorder,
        "window": {"selection": how, "measured": len(measured), "attributed": len(w.rows),
                   "failed": fails["failed"], "no_first_packet": len(no_ttfp),
                   "untraced": len(untraced), "traced_requests": len(traced),
                   "api_requests": has_api,
                   "spans": run.span_count, "spans_skipped_warmup": run.skipped_spans},
        "failures": fails,
        "stages": {str(k): v for k, v in sorted(names.items())},
        "categories": [{"category": c, "description": d} for c, d in at.DESCRIPTIONS.items()],
        "ttfp": _ttfp(w, requests),
        "attribution": agg,
        "not_observed": unseen,
        "fifo": fifo,
        "snapshot": snapshot,
        "transfer": transfer,
        "incomplete_chunk_spans": chunk_incomplete,
        "head_of_line": hol_rows,
        "head_of_line_pairs": hol_pairs,  # all victim x culprit pairs; the list holds the largest
        "head_of_line_victims": hol_victims,
        "head_of_line_note": HOL_NOTE,
        "requests": requests,
        "waterfalls": wfs,
    }
