"""The pieces of --flame that need a process: a real py-spy's samples put on our clock (a
process whose phases are known to the nanosecond), and the --flame options' one-line
errors from the real command. The in-process pieces: tests/unit/profile/test_flame.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tests.support.flame_run import may_run_realtime

from omnitrace.profile import chrometrace as ct
from omnitrace.profile import clock, finalize, linked, render
from omnitrace.profile.config import FlameConfig
from omnitrace.profile.runner import PYSPY_NICE, PySpy, prioritize
from omnitrace.profile.store import ROUND_DTYPE, Store, collapsed

TARGET = textwrap.dedent('''
    import sys, time, random, threading
    import numpy as np
    from omnitrace.profile.clock import Clock
    c = Clock(rate=250); c.start()  # py-spy's rate below, as a run's processes read it from OMNITRACE_FLAME
    stop = threading.Event()
    def other():  # a second busy thread, contending for the GIL like a sender
        while not stop.is_set():
            s = 0
            for i in range(20000): s += i
            time.sleep(0.001)
    threading.Thread(target=other, daemon=True).start()
    def spin(d):
        end = time.perf_counter_ns() + d
        while time.perf_counter_ns() < end: pass
    def short_phase(d): spin(d)  # the "span": 20-40 ms (a sampling period is 4 ms), bounds noted
    def long_phase(d): spin(d)
    rnd = random.Random(7); marks = []
    print("ready", flush=True)
    sys.stdin.readline()  # py-spy samples from here on
    t_end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < t_end:
        time.sleep(rnd.uniform(0.002, 0.005))
        a = time.perf_counter_ns(); short_phase(int(rnd.uniform(20e6, 40e6))); b = time.perf_counter_ns()
        marks.append((a, b))
        long_phase(int(rnd.uniform(20e6, 60e6)))
    stop.set(); c.stop.set(); c.join()
    np.save(sys.argv[1] + ".marks.npy", np.array(marks, np.int64))
    c.path = sys.argv[1] + ".clock.bin"; c.flush()
''')


def test_pyspy_samples_land_on_our_clock(tmp_path):
    """A real py-spy, calibrated by the clock thread: samples showing the short phase fall
    inside its own noted intervals, and the intervals select mostly that phase. py-spy
    stamps a sample when it handles it, on a 2-core VM a quarter of them 0.2-3 ms after
    reading it and more beside a core-burning process: the phases last 20-40 ms so that
    lag costs a few percent, not the verdict (with 1-2 ms phases a burner beside the suite
    took the agreement from ~70% to 24%); a wrong offset would give the phase's share of
    the main thread's time, ~40%."""
    base = str(tmp_path / "t")
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(script), base, "4"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    cfg = FlameConfig(run_dir=str(tmp_path), rate=250)
    os.makedirs(cfg.raw_dir)
    spy = PySpy(cfg, proc.pid, 0)  # as the runner starts it
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert spy.start(), spy.error
        # every py-spy thread runs ahead of the target's where that is allowed: real-time,
        # and nice -10 once it says it is behind
        realtime = may_run_realtime()
        assert spy.priority == ("realtime" if realtime else "normal")
        tids = [int(t) for t in os.listdir(f"/proc/{spy.proc.pid}/task")]
        assert {os.sched_getscheduler(t) for t in tids} == {os.SCHED_FIFO if realtime else os.SCHED_OTHER}
        if realtime:
            assert prioritize(spy.proc.pid, realtime=False) == "nice"
            assert {(os.sched_getscheduler(t), os.getpriority(os.PRIO_PROCESS, t)) for t in tids} == {(os.SCHED_OTHER, PYSPY_NICE)}
        started = spy.started_ns
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0
        spy.wait()
    finally:
        for p in (proc,):
            if p.poll() is None:
                p.kill()
                p.wait()
        spy.stop()
        spy.wait()
    frames = ct.Frames()
    chunk = ct.parse(os.path.join(cfg.raw_dir, spy.meta()["path"]), frames)  # compressed when done
    flips = np.fromfile(base + ".clock.bin", dtype="<i8")
    cal = ct.calibrate(chunk, frames, proc.pid, flips, clock.PREFIX, clock.K, started)
    assert cal is not None and cal.agreeing >= 0.9 * cal.observations, cal
    assert 0 <= cal.offset_ns - started < 5e9  # py-spy's zero: after we started it
    # a process killed before its last switches were written: the samples after them
    # cannot agree or disagree, and the same offset is found from the rest
    cut = ct.calibrate(chunk, frames, proc.pid, flips[:len(flips) // 3], clock.PREFIX, clock.K, started)
    assert cut is not None and cut.agreeing >= 0.9 * cut.observations, cut
    assert abs(cut.offset_ns - cal.offset_ns) <= max(cal.uncertainty_ns, cut.uncertainty_ns, 1_000_000), (cal, cut)
    marks = np.load(base + ".marks.npy")
    main = next(tid for (pid, tid), name in chunk.threads.items() if name == "MainThread")
    st = chunk.stretches[chunk.stretches["tid"] == main].copy()
    st["t"] = st["t"] * 1000 + cal.offset_ns
    st["end"] = st["end"] * 1000 + cal.offset_ns
    good = ct.consistent_rounds(chunk, frames, proc.pid, flips, clock.PREFIX, clock.K, cal.offset_ns)
    rounds = np.zeros(int(good.sum()), ROUND_DTYPE)
    rounds["pid"], rounds["t"] = proc.pid, chunk.rounds[good] * 1000 + cal.offset_ns
    store = Store(st, rounds, frames.frames, frames.stacks, 4_000_000, dict(chunk.threads))
    in_short = np.array([any(frames.frames[f][0] == "short_phase" for f in frames.stacks[s])
                         for s in st["stack"]])
    idx, t = store.samples()
    k = np.searchsorted(marks[:, 0], t, "right") - 1
    inside = (k >= 0) & (t < marks[np.maximum(k, 0), 1])
    short = in_short[idx]
    assert short.sum() >= 30, short.sum()
    assert inside[short].mean() >= 0.65, inside[short].mean()
    iv = linked.Intervals(marks[:, 0], marks[:, 1], np.full(len(marks), proc.pid, np.int64),
                          np.full(len(marks), main, np.int64))
    sel = linked.select(store, iv)
    assert render.share(collapsed(store, sel), "short_phase") >= 0.65
    # the finalizer's note per chunk says which time it covers, so a selection whose samples
    # were placed without a calibrated clock says so; with the clock file, none is named
    runner = {"chunks": [spy.meta()]}
    assert runner["chunks"][0]["pyspy_samples"] >= len(chunk.rounds), runner  # its last line, read
    assumed, _, _, (bad,), _ = finalize.load_chunks(str(tmp_path), runner, 0, ct.Frames())
    os.rename(base + ".clock.bin", os.path.join(cfg.raw_dir, f"clock-{proc.pid}.bin"))
    placed, _, _, (good,), _ = finalize.load_chunks(str(tmp_path), runner, 0, ct.Frames())
    assert not bad["calibrated"] and good["calibrated"], (bad, good)
    assert good["pyspy_samples"] == runner["chunks"][0]["pyspy_samples"], good
    assert good["pyspy_priority"] == spy.priority, good
    for note, st in ((bad, assumed), (good, placed)):
        assert (note["from_unix_ns"], note["to_unix_ns"]) == (st["t"].min(), st["end"].max()), note
        store = Store(st, rounds, frames.frames, frames.stacks, 4_000_000, dict(chunk.threads))
        said = linked.uncalibrated([note], store, np.arange(len(st)))
        if note is good:
            assert said == [], said
        else:
            assert len(said) == 1 and f"{len(st)} of {len(st)} samples" in said[0], said


@pytest.mark.parametrize("args, needle", [
    (["--flame-rate", "50"], "--flame-rate needs --flame"),
    (["--flame", "--flame-rate", "0"], "--flame-rate must be 1..1000"),
    (["--flame", "--flame-mode", "sometimes"], "invalid choice"),
    (["--flame", "--flame-tool", "/nonexistent/py-spy"], "not found or not executable"),
])
def test_flame_options_bad_input(tmp_path, args, needle):
    r = subprocess.run([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(tmp_path / "r"), *args,
                        "--", sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "r" / "run.json")  # nothing started
