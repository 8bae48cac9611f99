"""How long `omnitrace report` takes on a big run: synthetic run directories of N spans
(OTLP JSON lines, 512 spans per line like the agent writes), timed load + attribution +
console + HTML, for several N to show how it grows.

    python benchmarks/report_scaling.py                 # 125k, 250k, 500k, 1M spans
    python benchmarks/report_scaling.py --spans 1000000 --keep /tmp/big-run

Each synthetic request has ~1,000 spans (100 thinker chunks, 100 talker tasks, 4 codec
chunks), the shape of a 100-token request through the reference pipeline.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import orjson

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.support.otlp_fixture import chunk_spans, span  # noqa: E402

from omnitrace import conventions as cv  # noqa: E402

K = 100  # thinker chunks (= talker frames) per request


def request_spans(rid: str, o: float) -> list[dict]:
    def t(a: float, b: float) -> tuple[float, float]:
        return (o + a, o + b)
    out = [span(cv.SPAN_REQUEST, rid, *t(0, 30000), stage=-1,
                events=[(cv.EVENT_TTFT, o + 500, {}), (cv.EVENT_TTFP, o + 2900, {})]),
           span(cv.SPAN_STAGE, rid, *t(10, 29000), stage=0, **{cv.ATTR_STAGE_NAME: "thinker"}),
           span(cv.SPAN_STAGE_QUEUE, rid, *t(10, 20), stage=0),
           span(cv.SPAN_STAGE, rid, *t(300, 29500), stage=1, **{cv.ATTR_STAGE_NAME: "talker"}),
           span(cv.SPAN_STAGE_QUEUE, rid, *t(300, 310), stage=1),
           span(cv.SPAN_STAGE, rid, *t(1000, 29900), stage=2, **{cv.ATTR_STAGE_NAME: "code2wav"},
                events=[(cv.EVENT_EMIT, o + 2800, {cv.ATTR_MODALITY: "audio", cv.ATTR_PACKET_INDEX: 0})]),
           span(cv.SPAN_STAGE_QUEUE, rid, *t(1000, 1001), stage=2)]
    for k in range(K):
        b = 200 + 250 * k
        out += chunk_spans(rid, 0, 1, k, t(b, b + 5), t(b + 5, b + 40), t(b + 40, b + 60), t(b + 60, b + 70),
                           t(b + 70, b + 75), t(b + 75, b + 80), t(b + 80, b + 90), blocked_us=10,
                           blocked_by=["other"])
        c = k // 25
        out += [span(cv.SPAN_SNAPSHOT, rid, *t(b + 150, b + 152), stage=1, peer=2, chunk=c),
                span(cv.SPAN_FIFO, rid, *t(b + 152, b + 160), stage=1, peer=2, chunk=c),
                span(cv.SPAN_PROCESS, rid, *t(b + 160, b + 165), stage=1, peer=2, chunk=c,
                     **{cv.ATTR_TRANSFER_BYTES: 4096 if k % 25 == 3 else 0})]
        if k % 25 == 3:
            out += [span(cv.SPAN_PUT, rid, *t(b + 165, b + 170), stage=1, peer=2, chunk=c),
                    span(cv.SPAN_POLL, rid, *t(b + 170, b + 180), stage=2, peer=1, chunk=c),
                    span(cv.SPAN_GET, rid, *t(b + 180, b + 185), stage=2, peer=1, chunk=c),
                    span(cv.SPAN_WAIT_SCHEDULE, rid, *t(b + 185, b + 190), stage=2, peer=1, chunk=c)]
    return out


def realistic(spans: list[dict]) -> list[dict]:
    """Add what the agent writes besides our fields, so lines are as long as real ones (~1 KB/span)."""
    for d in spans:
        a = {x["key"]: x["value"] for x in d["attributes"]}
        d["parentSpanId"] = d["spanId"][::-1]
        d["kind"], d["status"], d["flags"] = 1, {}, 256
        extra = [{"key": cv.ATTR_REPLICA, "value": {"intValue": "0"}}]
        if cv.ATTR_PEER_STAGE_ID in a:
            st, peer = int(a[cv.ATTR_STAGE_ID]["intValue"]), int(a[cv.ATTR_PEER_STAGE_ID]["intValue"])
            pair = cv.stage_pair(*sorted((st, peer)))
            extra.append({"key": cv.ATTR_STAGE_PAIR, "value": {"stringValue": pair}})
        d["attributes"] += extra
    return spans


RESOURCE = {"attributes": [{"key": k, "value": {"stringValue": v}} for k, v in (
    ("service.name", "omnitrace"), ("service.instance.id", "20261130-000000-0000/12345"),
    ("omni.role", "stage"), ("process.executable.name", "thinker"),
    ("omnitrace.run.id", "20261130-000000-0000"))]}


def make_run(path: str, n_spans: int) -> int:
    os.makedirs(path, exist_ok=True)
    written, i, buf = 0, 0, []
    with open(os.path.join(path, "spans.jsonl"), "wb") as f:
        while written < n_spans:
            buf += realistic(request_spans(f"req{i}", i * 1000.0))
            i += 1
            while len(buf) >= 512 or (buf and written + len(buf) >= n_spans):
                part, buf = buf[:512], buf[512:]
                f.write(orjson.dumps({"resourceSpans": [{"resource": RESOURCE,
                                      "scopeSpans": [{"scope": {"name": "omnitrace"}, "spans": part}]}]}) + b"\n")
                written += len(part)
                if written >= n_spans:
                    break
    for name, d in (("run.json", {"run_id": f"synthetic-{n_spans}", "status": "complete", "exit_code": 0}),
                    ("agent.json", {"events_read": 2 * written, "events_dropped": 0})):
        with open(os.path.join(path, name), "wb") as f:
            f.write(orjson.dumps(d))
    return written


def time_report(path: str, html: str) -> dict[str, float]:
    from omnitrace.analyze.report import build_report
    from omnitrace.analyze.rundir import load_run
    from omnitrace.render.console import render
    from omnitrace.render.html import write_html
    import resource
    c0 = time.process_time()
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run = load_run([path])
    t1 = time.perf_counter()
    rep = build_report(run)
    t2 = time.perf_counter()
    render(rep)
    write_html(rep, html)
    t3 = time.perf_counter()
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
    return {"spans": run.span_count, "requests": rep["window"]["attributed"], "load_s": t1 - t0,
            "attribute_s": t2 - t1, "render_s": t3 - t2, "total_s": t3 - t0,
            "cpu_s": time.process_time() - c0 + children, "parent_cpu_s": time.process_time() - c0,
            "load_avg": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--spans", type=int, nargs="+", default=[125_000, 250_000, 500_000, 1_000_000])
    p.add_argument("--keep", default=None, help="keep the largest run directory here")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="omnitrace-scaling-")
    try:
        print(f"{'spans':>9} {'requests':>8} {'load s':>7} {'attrib s':>8} {'render s':>8} {'total s':>7} "
              f"{'us/span':>7} {'cpu s':>7} {'parent cpu s':>12} {'loadavg':>7}")
        for n in args.spans:
            d = os.path.join(tmp, f"run-{n}")
            make_run(d, n)
            r = time_report(d, os.path.join(tmp, f"r-{n}.html"))
            print(f"{r['spans']:>9} {r['requests']:>8} {r['load_s']:>7.2f} {r['attribute_s']:>8.2f} "
                  f"{r['render_s']:>8.2f} {r['total_s']:>7.2f} {r['total_s'] / r['spans'] * 1e6:>7.2f} "
                  f"{r['cpu_s']:>7.2f} {r['parent_cpu_s']:>12.2f} {r['load_avg']:>7.1f}", flush=True)
            if args.keep and n == max(args.spans):
                shutil.copytree(d, args.keep, dirs_exist_ok=True)
            shutil.rmtree(d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
