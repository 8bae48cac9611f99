"""The pieces of --flame on their own, in process: selection by intervals, the SVG and
speedscope writers, the clock thread's schedule, selection mistakes as one line. A real
py-spy on our clock and the options' errors from the real command:
tests/system/profile/test_flame_parts.py."""
from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from tests.support.report_util import replay_timeline, speedscope_errors

from omnitrace.profile import chrometrace as ct
from omnitrace.profile import clock, finalize, linked, render
from omnitrace.profile.config import FlameConfig
from omnitrace.profile.runner import behind_s
from omnitrace.profile.store import ROUND_DTYPE, Store, collapsed, in_order


def _store(rows: list[tuple[int, int, int, int, int]], rounds: list[int]) -> Store:
    frames = [("root", "a.py", 1), ("work", "a.py", 2), ("idle", "a.py", 3)]
    stacks = [(0, 1), (0, 2)]
    st = np.array(rows, ct.STRETCH_DTYPE)
    r = np.zeros(len(rounds), ROUND_DTYPE)
    r["pid"], r["t"] = 1, rounds
    return Store(st, r, frames, stacks, 10, {(1, 7): "MainThread"})
def test_select_counts_each_sample_once_per_round():
    # work over rounds 0, 10, 20; idle over 30, 40
    store = _store([(0, 30, 1, 7, 0), (30, 50, 1, 7, 1)], [0, 10, 20, 30, 40])
    iv = linked.Intervals(np.array([5, 8, 35]), np.array([25, 22, 45]), np.ones(3, np.int64),
                          np.full(3, 7, np.int64))
    sel = linked.select(store, iv)  # overlapping intervals: rounds 10, 20 once; 40
    assert sorted(store.stretches["stack"][sel].tolist()) == [0, 0, 1]
    assert linked.covered_ns(iv) == (25 - 5) + (45 - 35)
    other = linked.Intervals(np.array([0]), np.array([50]), np.ones(1, np.int64), np.full(1, 8, np.int64))
    assert len(linked.select(store, other)) == 0  # another thread: nothing
def test_selection_seconds_are_the_real_gaps_in_time_order():
    """Each sample stands for the gap until its process's next written round (a round is
    written only when some thread changed), capped; the selection keeps time order, and its
    speedscope file shows it in that order (runs of one stack joined)."""
    # work 0-30 (rounds 0, 20: nothing changed at 10), idle 30-60 (rounds 30, 50), work 60-
    store = _store([(0, 30, 1, 7, 0), (30, 60, 1, 7, 1), (60, 2000, 1, 7, 0)], [0, 20, 30, 50, 60, 1000])
    iv = linked.Intervals(np.array([0]), np.array([2000]), np.ones(1, np.int64), np.full(1, 7, np.int64))
    idx, secs = linked.select_time(store, iv)
    assert store.stretches["stack"][idx].tolist() == [0, 0, 1, 1, 0, 0]
    cap = linked.HOLD_MAX_PERIODS * store.period_ns
    assert (secs * 1e9).round().tolist() == [20, 10, 20, 10, min(940, cap), 10]  # last: one period
    order = in_order(store, idx, secs)
    assert [(st[-1], round(w * 1e9)) for st, w in order] == [
        ("work (a.py)", 30), ("idle (a.py)", 30), ("work (a.py)", min(940, cap) + 10)]
    prof = render.speedscope([("sel", order)], "x")["profiles"][0]
    frames = render.speedscope([("sel", order)], "x")["shared"]["frames"]
    assert [frames[s[-1]]["name"] for s in prof["samples"]] == ["work", "idle", "work"]
def test_svg_and_speedscope_writers():
    stacks = {("main", "work (a.py)"): 0.75, ("main", "idle (a.py)"): 0.25, ("main", "tiny"): 1e-6}
    svg = render.svg(stacks, "t <&>", "sub")
    root = ET.fromstring(svg)
    titles = [e.text for e in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("work (a.py) — 750.0 ms (75.00%)") for t in titles), titles
    assert not any(t.startswith("tiny") for t in titles)  # narrower than half a pixel
    assert render.share(stacks, "work") == pytest.approx(0.75, rel=1e-5)
    doc = render.speedscope([("p", stacks)], "x")
    prof = doc["profiles"][0]
    assert prof["type"] == "sampled" and len(prof["samples"]) == len(prof["weights"]) == 3
    assert prof["endValue"] == pytest.approx(sum(prof["weights"]))
    assert all(0 <= i < len(doc["shared"]["frames"]) for s in prof["samples"] for i in s)
    names = {f["name"] for f in doc["shared"]["frames"]}
    assert {"main", "work", "idle"} <= names
    json.dumps(doc)


def _brief() -> None:
    time.sleep(0.002)
def test_pyinstrument_profile_keeps_frames_under_one_percent(tmp_path):
    """A call that took ~0.3% of the session is in the SVG's stacks and in the speedscope
    file (pyinstrument's renderers drop frames under 1% unless told to show all)."""
    from pyinstrument import Profiler

    from omnitrace.profile.inproc import load_collapsed
    prof = Profiler(interval=0.001)
    prof.start()
    t0 = time.perf_counter()
    _brief()
    # the rest of the session: 300x what _brief took (with the time before it), however
    # long a loaded machine made it, so _brief stays under 1%
    time.sleep(max(0.3, 300 * (time.perf_counter() - t0)))
    prof.stop().save(str(tmp_path / "s.json"))
    stacks, doc = load_collapsed(str(tmp_path / "s.json"))
    brief = [s for s in stacks if any(f.startswith("_brief ") for f in s)]
    assert brief and sum(stacks[s] for s in brief) < 0.01 * sum(stacks.values()), stacks
    assert "_brief" in {f["name"] for f in doc["shared"]["frames"]}
def test_rounds_cluster_one_sample_of_all_threads():
    stamps = np.array([1000, 1003, 1010, 5000, 5002, 5100, 9000])
    assert ct.rounds(stamps, gap_us=50).tolist() == [1000, 5000, 5100, 9000]
def test_a_thread_name_py_spy_read_once_is_kept(tmp_path):
    """py-spy leaves a thread's name out of the samples it took while it could not read the
    threading module's table ('thread (77)'): the name read elsewhere stands, within a
    chunk and across chunks, and a later real name still replaces an old one."""
    def sample(ts, thread):
        return [{"ph": ph, "name": name, "pid": 5, "tid": 1, "ts": ts, "args": args}
                for ph, name, args in (("B", thread, {}), ("B", "work", {"filename": "w.py", "line": 3}),
                                       ("E", "work", {}), ("E", thread, {}))]
    path = tmp_path / "chunk.json"
    path.write_text(json.dumps(sample(10, "thread (77): MainThread") + sample(20, "thread (77)")
                               + sample(30, "thread (78)")))
    chunk = ct.parse(str(path), ct.Frames())
    assert chunk.threads == {(5, 77): "MainThread", (5, 78): ""}
    assert finalize.thread_names([chunk.threads, {(5, 77): ""}, {(5, 78): "sender"}]) == \
        {(5, 77): "MainThread", (5, 78): "sender"}
def test_speedscope_writer_follows_speedscopes_own_schema():
    stacks = {("main", "work (a.py)"): 0.75, ("main", "idle (a.py)"): 0.25}
    assert speedscope_errors(render.speedscope([("p", stacks), ("q", {})], "x")) == []
    broken = render.speedscope([("p", stacks)], "x")
    broken["profiles"][0]["type"] = "stacks"  # the schema's check is real
    assert speedscope_errors(broken)
def test_speedscope_timeline_is_what_happened():
    ms = 1_000_000
    t0 = 5_000 * ms
    main = [(t0, t0 + 10 * ms, ("main (a.py)", "work (a.py)")),
            (t0 + 10 * ms, t0 + 15 * ms, ("main (a.py)", "idle (a.py)")),
            (t0 + 30 * ms, t0 + 40 * ms, ("main (a.py)", "work (a.py)"))]  # 15 ms unseen
    sender = [(t0 + 2 * ms, t0 + 4 * ms, ("send (b.py)",))]
    doc = render.speedscope_timeline([("thread MainThread (1)", main), ("thread sender (2)", sender)], "p")
    assert speedscope_errors(doc) == []
    frames = doc["shared"]["frames"]
    got = replay_timeline(doc["profiles"][0], frames)
    assert got == [(0.0, 10.0, ("main", "work")), (10.0, 15.0, ("main", "idle")),
                   (30.0, 40.0, ("main", "work"))]  # in time order, the gap kept
    assert replay_timeline(doc["profiles"][1], frames) == [(2.0, 4.0, ("send",))]  # one time axis
    assert doc["profiles"][0]["endValue"] == 40.0
@pytest.mark.parametrize("leaf, parked", [
    ("Condition.wait (threading.py)", True), ("EpollSelector.select (selectors.py)", True),
    ("_PollLikeSelector.select (selectors.py)", True), ("Connection._recv (connection.py)", True),
    ("_worker (thread.py)", True), ("Queue.get (queue.py)", True),
    ("_walk (snapshot.py)", False), ("ShmConnector.put (shm.py)", False),
    ("Queue.get (queues.py)", False),  # asyncio's get: a coroutine, never the leaf of a wait
    ("select (mymodule.py)", False),
])
def test_waiting_frames(leaf, parked):
    """The leaves seen in the reference pipeline's profiles under load, sorted by the rule."""
    from omnitrace.profile import waiting
    assert waiting.is_waiting(leaf) is parked
def test_selection_title_states_the_sampling_error():
    """The error comes from the seconds each sample stands for: equal gaps give
    1/sqrt(n), unequal ones more (one long gap dominates the sum); a share of the split
    has half that, in points, at its widest."""
    assert linked.selection_title(np.full(4, 0.064), 0.175, 1920, 25) == (
        "0.175 s: the 1920 spans' own time on the working thread; split across code by 4 samples at "
        "25 Hz (±25.0 points sampling error on a share; the samples alone read 0.256 s, 146%)")
    assert linked.selection_title(np.zeros(0), 0.175, 3, 25) == (
        "0.175 s: the 3 spans' own time on the working thread; no sample at 25 Hz to split it")
    assert linked.selection_title(np.full(100, 0.001), 0.5, 10, 100, 0.3).endswith(
        "(±5.0 points sampling error on a share; the samples alone read 0.100 s, 20%, 0.300 s of it unsampled)")
    assert linked.sampling_error_pct(np.array([0.01, 0.01, 0.01, 0.01])) == pytest.approx(50)
    assert linked.sampling_error_pct(np.array([0.001, 0.001, 0.001, 0.037])) == pytest.approx(92.6, abs=0.1)
    assert linked.split_error_pp(np.array([0.001, 0.001, 0.001, 0.037])) == pytest.approx(46.3, abs=0.1)
def test_a_selection_totals_its_spans_own_time_and_the_samples_split_it():
    """Issue 41: thinker snapshots read 1.689 s from 36 samples against the spans' exact
    1.369 s. The total is the spans' time, exactly; the samples keep their shares."""
    # work over rounds 0, 10, 20; idle over 30, 40: the intervals cover 20 + 7 ns, the
    # samples in them (rounds 10, 20, 40) stand for 10 ns each
    store = _store([(0, 30, 1, 7, 0), (30, 50, 1, 7, 1)], [0, 10, 20, 30, 40])
    iv = linked.Intervals(np.array([5, 38]), np.array([25, 45]), np.ones(2, np.int64), np.full(2, 7, np.int64))
    idx, secs = linked.select_time(store, iv)
    covered = linked.covered_ns(iv) / 1e9
    assert covered == pytest.approx(27e-9) and secs.sum() == pytest.approx(30e-9)
    exact = linked.exact_split(secs, covered)
    stacks = collapsed(store, idx, exact)
    assert sum(stacks.values()) == pytest.approx(27e-9, rel=1e-12)
    assert stacks[("root (a.py)", "work (a.py)")] == pytest.approx(18e-9)  # 2 of 3 samples
    title = linked.selection_title(np.full(36, 1.689 / 36), 1.369, 2048, 25)
    assert title.startswith("1.369 s: the 2048 spans' own time") and "±8.3 points" in title, title
    assert "the samples alone read 1.689 s, 123%" in title, title
def test_time_py_spy_did_not_sample_is_found_and_not_held_over():
    """Rounds every 10 ms, then none for 500 ms while the clock thread kept switching (py-spy
    fell behind), then none for 100 ms without a switch (a thread held the GIL: nothing
    changed, py-spy may have sampled). Only the first is unsampled, from 7 periods (py-spy's
    random wait) and a stamp's lateness after the first switch on; a sample's time stops
    there."""
    period = 10_000_000
    rounds = np.array([0, 10, 20, 520, 530, 630, 640], np.int64) * 1_000_000
    flips = np.array([5, 25, 45, 65, 525, 645], np.int64) * 1_000_000
    a, b = finalize.unsampled(rounds, flips, period)
    assert (a.tolist(), b.tolist()) == ([25_000_000 + finalize.STALL_PERIODS * period + finalize.LATE_STAMP_NS],
                                        [520_000_000])
    # a process: a working thread across all of it; the gap as finalize stores it
    rnd = np.zeros(len(rounds), ROUND_DTYPE)
    rnd["pid"], rnd["t"] = 1, rounds
    gaps = finalize._unsampled_by_pid(rnd, {1: flips}, period)
    store = Store(np.array([(0, 700_000_000, 1, 7, 0)], ct.STRETCH_DTYPE), rnd,
                  [("root", "a.py", 1), ("work", "a.py", 2)], [(0, 1)], period, {(1, 7): "MainThread"}, gaps)
    iv = linked.Intervals(np.array([0]), np.array([700_000_000]), np.ones(1, np.int64), np.full(1, 7, np.int64))
    idx, secs = linked.select_time(store, iv)
    ms = (secs * 1e3).round(3).tolist()
    assert ms == [10, 10, 25 - 20 + 70 + 5, 10, 100, 10, 10], ms  # the 20 ms round stops at the gap
    assert linked.unsampled_ns(store, iv) == 520_000_000 - 100_000_000
    assert sum(ms) * 1e6 == pytest.approx(linked.covered_ns(iv) - linked.unsampled_ns(store, iv) - 50_000_000)
def test_pyspy_saying_it_is_behind_is_read():
    """py-spy's own line (Rust's Duration format), as its stdout gives it."""
    text = "py-spy> 2.31s behind in sampling, results may be inaccurate.\npy-spy> 512.3ms behind in sampling\n"
    assert behind_s(text.encode()) == [2.31, 0.5123]
    assert behind_s(b"py-spy> Sampling process 100 times a second. Press Control-C to exit.") == []
@pytest.mark.parametrize("args, says", [
    (["--request", "r1"], "--request needs --category"),
    (["--stage", "thinker", "--request", "r1"], "--request needs --category"),
    (["--category", "snapshot", "-o", "/nonexistent-folder/x"], "/nonexistent-folder is not a folder"),
])
def test_flame_selection_mistakes_are_one_line(tmp_path, capsys, args, says):
    """Issue 41: `--request` without `--category` drew the whole profile (rc 0), `-o` into a
    missing folder raised a traceback. Both: one line, exit 2, nothing read or written."""
    from omnitrace.cli import flame
    with pytest.raises(SystemExit) as exc:
        flame.main([str(tmp_path), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and says in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
@pytest.mark.parametrize("rate, most", [(1, 1), (10, 10), (25, 25), (50, 50), (100, 50), (250, 50)])
def test_clock_wakes_at_most_once_per_sample(rate, most):
    """Each switch of the clock thread is a wake-up and a GIL hand-off in every sampled
    process, most of what `--flame` adds to the served processes' CPU (issue 41,
    benchmarks/flame_results.md). Its schedule switches once per py-spy sample on average,
    never more than 50 times a second, and not much less (the calibration and the rounds
    py-spy writes need the switches). Counted on the seeded schedule itself, not timed."""
    import itertools
    import random
    hs = np.fromiter(itertools.islice(clock.holds(rate, random.Random(0)), 20000), float)
    per_s = len(hs) / hs.sum()
    assert most * 0.9 <= per_s <= most * 1.02, per_s
    lo, hi = clock.hold_range(rate)
    assert lo <= hs.min() and hs.max() <= hi
def test_clock_thread_keeps_to_its_schedule(monkeypatch, tmp_path):
    """The running thread holds each function at least as long as its schedule says (a sleep
    never ends early), so it switches no faster than the schedule above; its rate is the
    run's own (`--flame-rate`, from the environment) unless given."""
    import itertools
    import random
    from omnitrace.profile.config import ENV_FLAME
    monkeypatch.setenv(ENV_FLAME, FlameConfig(run_dir=str(tmp_path), rate=10).to_json())
    assert clock.Clock().rate == 10
    c = clock.Clock(rate=100, seed=3)
    c.start()
    time.sleep(0.2)
    c.stop.set()
    c.join(1)
    gaps = np.diff(np.asarray(c.flips, np.int64))
    want = np.fromiter(itertools.islice(clock.holds(100, random.Random(3)), len(gaps)), float) * 1e9
    assert len(gaps) >= 2 and (gaps >= want - 1000).all(), (gaps, want)


def test_a_run_without_a_readable_event_log_is_one_line_to_flame(tmp_path):
    """A span selection reads the event log: one recorded before it (spans.jsonl only) is
    the loader's one line (``SelectError``, which `omnitrace flame` says and exits 2 on),
    not a traceback."""
    from omnitrace.profile import linked
    (tmp_path / "spans.jsonl").write_text('{"resourceSpans": []}\n')
    with pytest.raises(linked.SelectError, match="recorded before the event log"):
        linked.build_index(str(tmp_path))
