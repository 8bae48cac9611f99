"""Plain-text rendering of a report dict (no colours, fixed-width tables)."""
from __future__ import annotations

from typing import Any, Sequence

from omnitrace.render.headline import headline

TOP = 3  # categories per request line


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[int] = ()) -> str:
    """Fixed-width columns: the first and those in ``left`` (text) left-aligned, the rest
    (numbers) right-aligned."""
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lefts = {0, *left}
    line = "  ".join(h.ljust(w) if i in lefts else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line.rstrip(), "  ".join("-" * w for w in widths)]
    for r in cells:
        out.append("  ".join(c.ljust(w) if i in lefts else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return "\n".join(out)


def render(rep: dict[str, Any], limit: int = 20) -> str:
    out = _header(rep) + _ttfp(rep["ttfp"]) + _failures(rep.get("failures") or {}) + _attribution(rep)
    out += _components(rep) + _head_of_line(rep["head_of_line"], limit) + _requests(rep["requests"], limit)
    return "\n".join(out)


def _header(rep: dict[str, Any]) -> list[str]:
    """The warning, headline, run and window lines, the recorder's account, the warnings."""
    out: list[str] = []
    rec = rep["recorder"]
    if rec["dropped"]:  # louder than the answer: the answer is built on what is left
        out.append(f"!! WARNING: the recorder DROPPED {rec['dropped']} events in this run; "
                   "affected requests are attributed from incomplete spans.")
    out += headline(rep) + [""]
    for r in rep["run"]:
        out.append(f"run {r.get('run_id')}  status={r.get('status')}  exit={r.get('exit_code')}")
    w = rep["window"]
    out.append(f"measured window: {w['measured']} requests ({w['selection']}); attributed "
               f"{w['attributed']}; failed {w.get('failed', 0)}; no first packet {w['no_first_packet']}; "
               f"traced {w['traced_requests']}; spans of the measured requests {w['spans']}")
    out.append("recorder: " + (f"events={rec['events']} dropped={rec['dropped']} spans_built="
                               f"{rec['spans_built']} (every traced request)" if rec["known"] else "counters unknown (no agent.json)")
               + "".join(f" {k}={rec[k]}" for k in ("never_drained", "not_recorded", "torn_records")
                         if rec.get(k)))
    if rec.get("accounting"):
        out.append(rec["accounting"]["headline"])
    for kind, c in (rec.get("exporters") or {}).items():
        out.append(f"exporter {kind}: exported={c['exported']} failed={c['failed']} "
                   f"dropped={c['dropped']} sampled_out={c.get('sampled_out', 0)} "
                   f"never_built_live={c.get('not_built_live', 0)}")
    return out + [f"warning: {msg}" for msg in rep["warnings"]]


def _ttfp(t: dict[str, Any]) -> list[str]:
    if not t["server_ms"]["count"]:
        return []
    s, c = t["server_ms"], t["client_ms"]
    out = ["", table(["TTFP (ms)", "n", "mean", "p50", "p90", "p99", "max"],
                     [["server", s["count"], s["mean"], s["p50"], s["p90"], s["p99"], s["max"]]]
                     + ([["client (bench)", c["count"], c["mean"], c["p50"], c["p90"], c["p99"],
                          c["max"]]] if c["count"] else [])),
           f"categories sum to TTFP: max |error| = {t['sum_error_max_ns']} ns"]
    if t["client_minus_server_median_ms"] is not None:
        d = t["client_minus_server_ms"]
        out.append(f"client - server TTFP (HTTP overhead): median {t['client_minus_server_median_ms']:.3f} ms, "
                   f"p99 {d['p99']:.3f} ms")
    return out


def _failures(fl: dict[str, Any]) -> list[str]:
    if not fl.get("failed"):
        return []
    return ["\nFailed measured requests, by cause",
            table(["cause", "requests", "how the client saw it", "example"],
                  [[c["cause"], c["count"], ", ".join(f"{n} {h}" for h, n in c["how"].items()),
                    c["example"][:60]] for c in fl["causes"]], left=(2, 3))]


def _attribution(rep: dict[str, Any]) -> list[str]:
    if not rep["attribution"]:
        return []
    out = ["\nAttribution of TTFP (critical path, per stage and category)",
           table(["stage", "category", "mean ms", "p50 ms", "p99 ms", "share"],
                 [[a["stage"], a["category"], a["mean_ms"], a["p50_ms"], a["p99_ms"],
                   f"{a['share'] * 100:.1f}%"] for a in rep["attribution"]], left=(1,))]
    used = {a["category"] for a in rep["attribution"]}
    desc = [c for c in rep.get("categories", []) if c["category"] in used]
    if desc:
        width = max(len(c["category"]) for c in desc)
        out.append("categories:")
        out += [f"  {c['category'].ljust(width)}  {c['description']}" for c in desc]
    return out


def _components(rep: dict[str, Any]) -> list[str]:
    """FIFO residence, snapshot cost and transfers: the figures of every chunk, not only the
    critical path's."""
    out: list[str] = []
    if rep["fifo"]:
        out.append("\nFIFO residence (producer stage)")
        out.append(table(["stage", "chunks", "p50 ms", "p99 ms", "max ms", "blocked p50", "blocked p99",
                          "depth mean", "depth max"],
                         [[f["stage"], f["count"], f["residence_p50_ms"], f["residence_p99_ms"],
                           f["residence_max_ms"], f["blocked_p50_ms"], f["blocked_p99_ms"],
                           f["depth_mean"], f["depth_max"]] for f in rep["fifo"]]))
    if rep["snapshot"]:
        out.append("\nSnapshot cost per chunk")
        out.append(table(["stage", "chunks", "mean us", "p50 us", "p99 us", "max us"],
                         [[s["stage"], s["count"], s["mean_us"], s["p50_us"], s["p99_us"], s["max_us"]]
                          for s in rep["snapshot"]]))
    if rep["transfer"]:
        out.append("\nTransfers per stage pair")
        out.append(table(["pair", "puts", "put p50 us", "put p99 us", "put MB/s", "gets", "get p50 us",
                          "get p99 us", "get MB/s", "bytes/chunk"],
                         [[x["pair"], x["put"]["count"], x["put"]["p50_us"], x["put"]["p99_us"],
                           x["put"]["bandwidth_mb_s"], x["get"]["count"], x["get"]["p50_us"],
                           x["get"]["p99_us"], x["get"]["bandwidth_mb_s"], x["put"]["mean_bytes"]]
                          for x in rep["transfer"]]))
    return out


def _head_of_line(hol: list[dict[str, Any]], limit: int) -> list[str]:
    if not hol:
        return []
    return ["\nHead-of-line blocking before the first packet (wall time), top victim x culprit pairs",
            table(["victim", "culprit", "blocked ms", "victim TTFP ms", "culprit tasks"],
                  [[h["victim"], h["culprit"], h["blocked_ms"], h["victim_ttfp_ms"], h["tasks"]]
                   for h in hol[:limit]]),
            "blocked ms: time before the victim's first packet during which one of its "
            "critical-path chunks\nwaited in a FIFO while the sender worked on the culprit's "
            "task (never more than the TTFP)"]


def _requests(requests: list[dict[str, Any]], limit: int) -> list[str]:
    if not requests:
        return []
    shown = requests[:limit]
    rows = []
    for r in shown:
        top = sorted(r["categories_ms"].items(), key=lambda kv: -kv[1])[:TOP]
        top += [("", None)] * (TOP - len(top))
        rows.append([r["id"], r["ttfp_ms"], r["client_ttfp_ms"]]
                    + [x for k, v in top for x in (k, "" if v is None else f"{v:.1f}")])
    heads = [h for i in range(TOP) for h in (f"#{i + 1}", "ms")]
    return [f"\nPer request critical path (slowest {len(shown)} of {len(requests)}; "
            f"largest {TOP} categories; --json for all), ms",
            table(["request", "TTFP", "client"] + heads, rows, left=range(3, 3 + 2 * TOP, 2))]
