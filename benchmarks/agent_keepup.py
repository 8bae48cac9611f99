"""Does the agent keep up during a load test? `omnitrace run` + the reference pipeline +
`omnitrace bench` at c=32 (2,500 in, 200 out) for DURATION seconds, then Ctrl-C (SIGINT
to the process group, as a terminal sends it), with an optional core-burning process
beside it. Samples every second:

* backlog: ring slots written but not drained (read from the rings' cursors) plus
  decoded events waiting for the live views (agent.json), in seconds of the event rate;
* the agent's CPU (utime + stime of its process) as a share of one core;
* the run directory's event log on disk;

and prints a summary (JSON) with the time from Ctrl-C to `omnitrace run`'s exit.

    python benchmarks/agent_keepup.py --duration 600 [--burn]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from omnitrace import record  # noqa: E402

BURN = "import time\nwhile True:\n    sum(i * i for i in range(100000))\n"


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _ring_backlog(run_id: str) -> int:
    n = 0
    for name in record.discover(run_id):
        try:
            r = record.RingReader(name)
        except (OSError, ValueError):
            continue
        try:
            n += r.unread() if hasattr(r, "unread") else \
                r.written() - int.from_bytes(bytes(r.buf[record.OFF_READ:record.OFF_READ + 8]), "little")
        finally:
            r.close()
    return n


def _disk(run_dir: str) -> int:
    """Bytes of the run directory (event log, or an older agent's spans.jsonl and spool)."""
    total = 0
    for root, _, files in os.walk(run_dir):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=600)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--burn", action="store_true", help="a core-burning process beside the load")
    p.add_argument("--run-dir", default=None)
    args = p.parse_args()
    run_dir = args.run_dir or os.path.join(tempfile.mkdtemp(prefix="keepup-"), "run")
    burner = subprocess.Popen([sys.executable, "-c", BURN]) if args.burn else None
    cmd = [sys.executable, "-m", "omnitrace", "run", "--run-dir", run_dir, "--",
           sys.executable, "-m", "omnitrace.bench.serve_and_bench", "--serve", "--snapshot copy",
           "--", "--no-progress", "--concurrency", str(args.concurrency),
           # more than DURATION can finish (~10 req/s here); bench builds every body up front
           "--num-prompts", str(int(args.duration * 20) + 100),
           "--input-len", "2500", "--output-len", "200"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    # this tree's omnitrace first (the benchmark also runs older trees side by side)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    log = open(os.path.join(os.path.dirname(run_dir), "output.log"), "wb")
    proc = subprocess.Popen(cmd, start_new_session=True, env=env, stdout=log, stderr=log)
    samples = []
    try:
        run = {}
        deadline = time.monotonic() + 120
        while not run.get("agent_pid"):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                with open(log.name, "rb") as f:
                    tail = f.read()[-3000:].decode(errors="replace")
                print(f"omnitrace run did not start (exit {proc.poll()}):\n{tail}", file=sys.stderr)
                return 1
            time.sleep(0.5)
            run = _read(os.path.join(run_dir, "run.json"))
        agent_pid, run_id = run["agent_pid"], run["run_id"]
        t0 = time.monotonic()
        cpu0 = _cpu_s(agent_pid)
        last_ev, last_t = 0, t0
        while time.monotonic() - t0 < args.duration:
            time.sleep(1.0)
            now = time.monotonic()
            a = _read(os.path.join(run_dir, "agent.json"))
            ev = int(a.get("events_read", 0))
            rate = (ev - last_ev) / max(now - last_t, 1e-9)
            last_ev, last_t = ev, now
            backlog = (_ring_backlog(run_id) + int((a.get("views") or {}).get("backlog_events", 0))
                       # an agent before the event log: its spool of undecoded slots
                       + int((a.get("spool") or {}).get("backlog_bytes", 0)) // record.RECORD_SIZE)
            disk = _disk(run_dir)
            samples.append({"t": round(now - t0, 1), "rate": round(rate), "backlog": backlog,
                            "cpu": round(_cpu_s(agent_pid) - cpu0, 2), "disk": disk})
        load_s = time.monotonic() - t0
        cpu = _cpu_s(agent_pid) - cpu0
        stop0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(120)
            stop_s: float | None = time.monotonic() - stop0
        except subprocess.TimeoutExpired:
            stop_s = None  # did not end: reported as such, then killed (finally)
    finally:
        if burner:
            burner.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    a = _read(os.path.join(run_dir, "agent.json"))
    rates = [s["rate"] for s in samples[3:] if s["rate"] > 0] or [1]
    mean_rate = sum(rates) / len(rates)
    backlog_s = [s["backlog"] / mean_rate for s in samples[3:]]
    disk = _disk(run_dir)
    out = {
        "duration_s": round(load_s, 1), "burn": args.burn, "concurrency": args.concurrency,
        "events_per_s": round(mean_rate), "events_read": a.get("events_read"),
        "events_dropped": a.get("events_dropped"),
        "agent_cpu_share_of_one_core": round(cpu / load_s, 4),
        "max_backlog_s": round(max(backlog_s or [0]), 3),
        "disk_mb_per_s": round(disk / load_s / 1e6, 3), "disk_mb": round(disk / 1e6, 1),
        "ctrl_c_to_exit_s": round(stop_s, 2) if stop_s is not None else "did not exit in 120 s",
        "agent_final_s": a.get("final_s"), "views": a.get("views"),
        "record": a.get("record"), "max_rss_mb": round((a.get("max_rss_bytes") or 0) / 2**20, 1),
        "run_dir": run_dir,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
