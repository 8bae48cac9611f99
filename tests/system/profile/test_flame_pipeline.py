"""`omnitrace run --flame` on the real reference pipeline under load, recursive snapshots:
real stage processes, real py-spy (one per process), real event log.

Must hold (issue 11): every stage and the API server have a profile; the thinker's shows
the recursive snapshot function; the span-linked flame graph of the thinker's snapshot
spans is >= 80% inside that function (ground truth: the spans' own intervals); the
fifo_blocked one on the sender is in its put/processing frames, not idle waits; the
thread join is exact (native thread ids); the HTML report embeds the flame graphs and
renders them offline in Chromium.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tests.support.report_util import browser, open_in_speedscope, replay_timeline, speedscope_errors
from tests.support.flame_run import flame_run, may_run_realtime, within_sampling_error

# the seed scenario's shape (c=32, 2,500-token prompts), shorter: 32 requests, 160 tokens
# 100 Hz (the default is 25): enough samples in a 10-second run
BENCH = ["--no-progress", "--concurrency", "32", "--num-prompts", "32", "--warmup", "0",
         "--input-len", "2500", "--output-len", "160", "--seed", "3"]


def flame(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnitrace", "flame", *args], capture_output=True,
                          text=True, timeout=120)


def share(speedscope_path: str, *functions: str) -> tuple[float, float]:
    """(share of the weight whose stack holds one of ``functions``, total ms) of a
    speedscope file, read as a user would: frames by name."""
    with open(speedscope_path) as f:
        doc = json.load(f)
    frames = doc["shared"]["frames"]
    hit = total = 0.0
    for prof in doc["profiles"]:
        for names, w in weighted_stacks(prof, frames):
            total += w
            if any(n in functions for n in names):
                hit += w
    return (hit / total if total else 0.0), total


def weighted_stacks(prof: dict, frames: list[dict]) -> list[tuple[tuple[str, ...], float]]:
    """(stack of frame names, ms) of a sampled or an evented (timeline) speedscope profile."""
    if prof["type"] == "sampled":
        return [(tuple(frames[i]["name"] for i in s), w) for s, w in zip(prof["samples"], prof["weights"])]
    return [(names, end - start) for start, end, names in replay_timeline(prof, frames)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("flame") / "run")
    r = flame_run(d, BENCH, "--snapshot recursive --shm pool", "--flame-rate", "100")
    assert "flame graphs in" in r.stderr and "missing" not in r.stderr, r.stderr[-2000:]
    return d


def test_every_stage_and_the_api_have_a_profile(run_dir):
    pdir = os.path.join(run_dir, "profiles")
    with open(os.path.join(pdir, "index.json")) as f:
        index = json.load(f)
    assert {p["name"] for p in index["profiles"]} == {"api", "thinker", "talker", "code2wav"}
    assert index["missing"] == []
    for p in index["profiles"]:
        assert p["tool"] == "py-spy" and p["seconds"] > 1.0, p
        assert 0.05 < p["rounds_known"] <= 1.0, p
        # py-spy's own count: it took at least the rounds written (unchanged ones are not)
        assert 0 <= p["pyspy_errors"] < p["pyspy_samples"], p
        assert 0 < p["waiting_s"] < p["seconds"], p  # parked threads: drawn on request only
        with open(os.path.join(pdir, f"{p['name']}.speedscope.json")) as f:
            doc = json.load(f)
        assert doc["$schema"].endswith("file-format-schema.json")
        assert {x["type"] for x in doc["profiles"]} == {"evented"}  # a true timeline per thread
        assert sum(len(x["events"]) for x in doc["profiles"]) > 20
        # the timeline holds the same thread time as the profile's figure
        ms = sum(w for x in doc["profiles"] for _, w in weighted_stacks(x, doc["shared"]["frames"]))
        assert ms / 1e3 == pytest.approx(p["seconds"], rel=0.01, abs=0.01)
        root = ET.parse(os.path.join(pdir, f"{p['name']}.svg")).getroot()
        assert root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}rect")) > 10
    # the clock put every process's samples on the event log's clock
    for c in index["clock"]:
        assert c["calibrated"] and c["agreeing"] >= 0.5 * c["clock_samples"], c  # a wrong offset: ~5%
    names = {t["name"] for p in index["profiles"] if p["name"] == "thinker" for t in p["threads"]}
    assert {"MainThread", "sender"} <= names and "omnitrace-flame-clock" not in names


def test_every_speedscope_file_is_valid_and_opens_in_speedscope(run_dir, tmp_path):
    """speedscope's own schema accepts each file (per stage, and a span-linked selection),
    and speedscope itself opens each in Chromium, showing its profiles."""
    flame(run_dir, "--stage", "thinker", "--category", "snapshot", "-o", str(tmp_path / "sel"))
    paths = sorted(glob.glob(os.path.join(run_dir, "profiles", "*.speedscope.json"))) + \
        [str(tmp_path / "sel.speedscope.json")]
    assert len(paths) == 5
    docs = {}
    for p in paths:
        with open(p) as f:
            docs[os.path.basename(p)] = doc = json.load(f)
        assert speedscope_errors(doc) == [], p
    shown = open_in_speedscope(paths)
    for name, doc in docs.items():
        first = doc["profiles"][doc.get("activeProfileIndex", 0)]["name"]
        assert first in shown[name], (name, first, shown[name][:300])


def test_thinker_profile_shows_the_recursive_snapshot(run_dir):
    sh, total = share(os.path.join(run_dir, "profiles", "thinker.speedscope.json"), "snapshot_recursive")
    assert total > 0 and sh > 0.0
    with open(os.path.join(run_dir, "profiles", "thinker.svg")) as f:
        assert "snapshot_recursive" in f.read()


@pytest.fixture(scope="module")
def spans(run_dir):
    from tests.support.agent_util import read_spans
    return read_spans(run_dir)


def test_snapshot_spans_flame_is_the_snapshot_function(run_dir, spans, tmp_path):
    out = str(tmp_path / "snap")
    r = flame(run_dir, "--stage", "thinker", "--category", "snapshot", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["samples"] >= 30, summary  # enough to mean something
    # the seconds come from the samples alone (each the real gap it stands for, not the
    # nominal period, which read 33-43% low); the truth: the thinker's snapshot spans as
    # `omnitrace export` writes them (one scheduler thread: they do not overlap)
    truth = sum(int(x["endTimeUnixNano"]) - int(x["startTimeUnixNano"]) for x in spans
                if x["name"] == "omni.chunk.snapshot" and x["attrs"]["omni.stage.id"] == 0) / 1e9
    assert summary["interval_s"] == pytest.approx(truth, rel=1e-3), (summary, truth)
    assert within_sampling_error(summary, truth), (summary, truth)
    # the selection's total is the spans' own time, exactly; the samples only split it
    sh, total_ms = share(out + ".speedscope.json", "snapshot_recursive")
    assert summary["seconds"] == pytest.approx(truth, rel=1e-3), (summary, truth)
    assert total_ms / 1e3 == pytest.approx(truth, rel=1e-3), (total_ms, truth)
    print(f"\nthinker snapshot spans: {summary['samples']} samples, {sh:.1%} in snapshot_recursive")
    assert sh >= 0.8
    assert ET.parse(out + ".svg").getroot().tag.endswith("svg")


def test_fifo_blocked_sender_flame_is_put_and_processing(run_dir, spans, tmp_path):
    out = str(tmp_path / "blocked")
    r = flame(run_dir, "--stage", "thinker", "--category", "fifo_blocked", "--thread", "sender",
              "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["samples"] >= 30, summary
    # the intervals: the sender's busy time while other requests' chunks waited, a union
    # (the victims' omni.fifo.blocked_ns sum it once per victim: an upper bound)
    blocked = sum(x["attrs"].get("omni.fifo.blocked_ns", 0) for x in spans
                  if x["name"] == "omni.chunk.fifo" and x["attrs"]["omni.stage.id"] == 0) / 1e9
    assert 0 < summary["interval_s"] <= blocked * 1.001, (summary, blocked)
    assert within_sampling_error(summary, summary["interval_s"]), summary
    work, _ = share(out + ".speedscope.json", "ShmConnector.put", "HiddenProcessor.process")
    with open(out + ".speedscope.json") as f:
        doc = json.load(f)
    frames = doc["shared"]["frames"]
    prof = doc["profiles"][0]
    idle = sum(w for s, w in zip(prof["samples"], prof["weights"])
               if frames[s[-1]]["name"] == "Condition.wait") / sum(prof["weights"])
    print(f"\nthinker sender while victims were blocked: {summary['samples']} samples, "
          f"{work:.1%} put/processing, {idle:.1%} idle waits")
    assert work >= 0.75 and idle <= 0.15


def test_thread_join_is_exact(run_dir):
    """Every ring's native thread id is the id py-spy sampled under that thread's name."""
    from omnitrace import eventlog
    from omnitrace.profile.store import Store
    store = Store.load(os.path.join(run_dir, "profiles", "samples.npz"))
    log = eventlog.read_event_log(run_dir)
    checked = 0
    for ring in log.rings.values():
        if ring.get("role") not in ("api", "stage"):
            continue
        key = (int(ring["pid"]), int(ring["tid"]))
        assert store.threads.get(key) == ring["thread"], (ring, store.threads.get(key))
        has = (store.stretches["pid"] == key[0]) & (store.stretches["tid"] == key[1])
        assert has.any(), ring
        checked += 1
    assert checked >= 7  # api + 3 schedulers + 2 senders + 2 receivers, at least


def test_blocked_intervals_are_the_span_builders(run_dir):
    """The index `omnitrace flame` selects from (profiles/spans.npz) gives, per FIFO span,
    blocked parts summing to the span builder's omni.fifo.blocked_ns exactly, and own parts
    that are the rest of the wait."""
    from omnitrace import eventlog
    from omnitrace import spantable as stt
    from omnitrace.profile import linked
    index = linked.SpanIndex.load(os.path.join(run_dir, "profiles", "spans.npz"))
    log = eventlog.read_event_log(run_dir)  # the span builder on the whole record: the truth
    builder = stt.SpanBuilder(log.rings)
    builder.ring_changed()
    truth = np.concatenate([builder.feed(log.events).spans.chunks, builder.flush().spans.chunks])
    truth = truth[truth["name"] == stt.N_FIFO]
    fifo = index.spans[index.spans["name"] == stt.N_FIFO]
    order_t = np.lexsort((truth["chunk"], truth["start"], truth["req"], truth["stage"]))
    order_i = np.lexsort((fifo["start"], fifo["req"], fifo["stage"]))
    assert len(fifo) == len(truth) > 100
    truth, fifo = truth[order_t], fifo[order_i]
    assert np.array_equal(truth["start"], fifo["start"]) and np.array_equal(truth["end"], fifo["end"])
    si, start, end = linked.blocked_parts(fifo, index.busy_by_sender(), index.threads.pids(fifo["ring"]))
    got = np.bincount(si, weights=end - start, minlength=len(fifo)).astype(np.int64)
    own_si, own_a, own_b = linked.own_parts(fifo, si, start, end)
    own = np.bincount(own_si, weights=own_b - own_a, minlength=len(fifo)).astype(np.int64)
    assert (truth["blocked"] > 0).sum() > 10
    assert np.array_equal(got, truth["blocked"])
    assert np.array_equal(got + own, fifo["end"] - fifo["start"])  # blocked + own = the wait


def test_flame_cli_lists_and_refuses_bad_input(run_dir, tmp_path):
    r = flame(run_dir)
    assert r.returncode == 0 and "thinker" in r.stdout and "MISSING" not in r.stdout, r.stdout
    assert ("real-time priority" in r.stdout) is not may_run_realtime(), r.stdout  # said where it could not
    for args, needle in (([run_dir, "--stage", "nope", "--category", "snapshot"], "unknown stage"),
                         ([run_dir, "--category", "snapshot", "--request", "no-such-id"], "not in this run"),
                         ([run_dir, "--category", "bogus"], "invalid choice"),
                         ([str(tmp_path)], "no profiles"),
                         ([str(tmp_path / "absent")], "not a run directory")):
        r = flame(*args)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_request_selection_is_that_requests_spans(run_dir, tmp_path):
    with open(os.path.join(run_dir, "bench.json")) as f:
        rid = json.load(f)["requests"][0]["id"]
    r = flame(run_dir, "--stage", "thinker", "--category", "snapshot", "--request", rid,
              "-o", str(tmp_path / "one"), "--json")
    assert r.returncode == 0, r.stderr
    one = json.loads(r.stdout)
    whole = json.loads(flame(run_dir, "--stage", "thinker", "--category", "snapshot", "-o",
                             str(tmp_path / "all"), "--json").stdout)
    assert 0 < one["spans"] < whole["spans"] and one["samples"] <= whole["samples"]
    # its seconds from the samples against its spans' own time (a request's snapshots
    # are ~1/32 of the thinker's, a handful of samples; its steps in the thinker are most
    # of the run)
    steps = json.loads(flame(run_dir, "--stage", "thinker", "--category", "compute", "--request", rid,
                             "-o", str(tmp_path / "steps"), "--json").stdout)
    assert steps["samples"] >= 50, steps
    assert within_sampling_error(steps, steps["interval_s"]), steps
    # the error from what each sample stands for: at least equal gaps' 1/sqrt(n), and the
    # split's (half of it, in points) is what the title says
    assert steps["sampling_error_pct"] >= round(100 / steps["samples"] ** 0.5, 1), steps
    said = re.search(r"±([\d.]+) points sampling error", open(steps["svg"], encoding="utf-8").read())
    assert said and float(said[1]) == steps["split_error_pp"], steps


def test_html_report_embeds_flame_graphs_offline(run_dir, tmp_path):
    out = str(tmp_path / "report.html")
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", run_dir, "--html", out],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with open(out, encoding="utf-8") as f:
        page_html = f.read()
    from omnitrace.profile.linked import CATEGORIES
    from tests.support.report_util import report_json
    rep = report_json(run_dir)
    assert "http://" not in page_html.split('id="flame"')[1].split("</section>")[0].replace(
        "http://www.w3.org/2000/svg", "")  # nothing to fetch
    with browser() as b:
        page = b.new_page(viewport={"width": 1300, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda req: errors.append(f"fetched {req.url}")
                if not req.url.startswith(("file:", "data:", "about:")) else None)
        page.goto("file://" + out)
        section = page.locator("#flame")
        section.scroll_into_view_if_needed()
        graphs = page.locator("#flame svg.omnitrace-flame")
        titles = [graphs.nth(i).locator("text").first.text_content() for i in range(graphs.count())]
        for name in ("api", "thinker", "talker", "code2wav"):
            assert any(t.startswith(name) for t in titles), titles
        # the report's top categories (a thread works in them), each at its costliest stage
        best: dict[str, tuple[float, str]] = {}
        for a in rep["attribution"]:
            if a["category"] in CATEGORIES and a["mean_ms"] > best.get(a["category"], (0.0, ""))[0]:
                best[a["category"]] = (a["mean_ms"], a["stage"].partition(":")[2])
        top = sorted(best, key=lambda c: -best[c][0])[:3]
        assert len(top) == 3
        for cat in top:
            assert f"{best[cat][1]} {cat}" in titles, (cat, titles)
        box = graphs.first.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 60
        page.screenshot(path=str(tmp_path / "flame.png"), full_page=True)
        assert not errors, errors


@contextlib.contextmanager
def svg_page(path):
    """A flame-graph SVG open in Chromium: (page, frames of the visible graph by name
    prefix, the page's errors)."""
    with browser() as b:
        page = b.new_page(viewport={"width": 1300, "height": 400})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"file://{path}")
        yield page, lambda name: page.locator(f'g.layout:visible g.f[data-n^="{name}"]'), errors


def test_svg_zooms_on_click_and_searches_in_chromium(tmp_path):
    """Click a frame: it fills the width and shows its full name, its ancestors span it,
    the rest hides; Reset zoom restores; Search highlights and says the matched share."""

    from omnitrace.profile import render
    stacks = {("main (a.py)", "wide_work (a.py)"): 0.90,
              ("main (a.py)", "narrow_function_with_a_long_name (b.py)", "leaf (b.py)"): 0.04,
              ("main (a.py)", "other (c.py)"): 0.06}
    path = tmp_path / "f.svg"
    path.write_text(render.svg(stacks, "zoom test"), encoding="utf-8")
    with svg_page(path) as (page, frame, errors):
        def width(name: str) -> float:
            return float(frame(name).locator("rect").get_attribute("width"))

        assert width("narrow_function") < 60 and frame("narrow_function").locator("text").count() == 1
        assert ".." in frame("narrow_function").locator("text").text_content()  # truncated
        frame("narrow_function").click()  # on its label, as a user would
        assert width("narrow_function") == pytest.approx(1200, abs=0.5)
        assert width("leaf") == pytest.approx(1200, abs=0.5)  # its only child
        assert width("main") == pytest.approx(1200, abs=0.5)  # an ancestor spans it
        assert frame("narrow_function").locator("text").text_content() == \
            "narrow_function_with_a_long_name (b.py)"
        assert not frame("wide_work").is_visible() and not frame("other").is_visible()
        page.locator("text", has_text="Reset zoom").click()
        assert frame("wide_work").is_visible() and width("wide_work") == pytest.approx(1080, abs=0.5)
        page.once("dialog", lambda d: d.accept("^(leaf|other)"))
        page.locator("text", has_text="Search").click()
        assert page.locator("text", has_text="Matched:").text_content() == "Matched: 10.0%"
        assert frame("leaf").locator("rect").get_attribute("fill") == "rgb(230,0,230)"
        assert errors == []


def test_svg_hides_waiting_threads_until_asked(tmp_path):
    """A per-process graph draws the working stacks; the waiting ones (a parked thread)
    appear on "Show waiting", the working ones then at their share of all thread time."""
    from omnitrace.profile import render, waiting
    stacks = {("thread MainThread (1)", "Stage._loop (stage.py)", "work (a.py)"): 0.3,
              ("thread MainThread (1)", "Stage._loop (stage.py)", "Condition.wait (threading.py)"): 0.1,
              ("thread sender (2)", "Sender._loop (transfer.py)", "Condition.wait (threading.py)"): 0.6}
    work, wait = waiting.split(stacks)
    assert list(work) == [next(iter(stacks))] and sum(wait.values()) == pytest.approx(0.7)
    path = tmp_path / "w.svg"
    path.write_text(render.svg(work, "waiting test", hidden=wait), encoding="utf-8")
    with svg_page(path) as (page, frame, errors):
        assert frame("work").count() == 1 and frame("Condition.wait").count() == 0
        assert float(frame("work").locator("rect").get_attribute("width")) == pytest.approx(1200, abs=0.5)
        toggle = page.locator("text", has_text="Show waiting (0.7 s)")
        toggle.click()
        assert frame("Condition.wait").count() == 2 and frame("thread sender").count() == 1
        assert float(frame("work").locator("rect").get_attribute("width")) == pytest.approx(360, abs=0.5)
        frame("thread sender").click()  # zoom works in this graph too
        assert float(frame("Sender._loop").locator("rect").get_attribute("width")) == pytest.approx(1200, abs=0.5)
        page.locator("text", has_text="Hide waiting").click()
        assert frame("Condition.wait").count() == 0 and frame("work").count() == 1
        assert errors == []
