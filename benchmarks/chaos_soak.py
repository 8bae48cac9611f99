"""Chaos soak: the reference pipeline at c=32 under `omnitrace run` for MINUTES minutes,
with a fault about every minute, then the checks a user's trust rests on.

Faults, in turn (one a minute; the agent is killed only in the first third, so that one
agent lives through the rest and its memory can be watched):

* agent   SIGKILL of the run's agent (a spare takes over its rings and event log);
* freeze  SIGSTOP of the thinker stage process for 15 s, then SIGCONT;
* otlp    the OTLP/gRPC receiver the agent exports to stopped for 30 s, then restarted
          on the same port;
* disk    the run directory's filesystem (a tmpfs of its own) filled for 20 s, then freed;
* stage   SIGKILL of the talker stage process, in the last minute (the reference pipeline
          does not restart stages: every request after it fails, named as such).

Then: `omnitrace report --json` must close the event accounting with no unexplained
loss; every fault must be named where the user looks (agent restarts and outages with
their times, the dead stage, the stall: bench's stall lines); nothing of the run may be
left in /dev/shm and no process of it alive; the agent that ran the last 20 minutes must
not have grown by more than 10% of its resident memory over them (sampled every 5 s; the
least-squares trend over the window, relative to its mean).

    python benchmarks/chaos_soak.py [--minutes 30] [--concurrency 32] [--out soak.json]

Needs root (the tmpfs). Figures: benchmarks/chaos_results.md.
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
from tests.support.otlp_receiver import Store, start_grpc  # noqa: E402
from tests.support.proctree import alive, descendants, json_or_empty  # noqa: E402

CYCLE = ("agent", "freeze", "otlp", "disk")
AGENT_KILLS_BEFORE = 1 / 3  # of the soak: later minutes skip the agent fault


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _stage_pid(run_dir: str, stage: int) -> int | None:
    try:
        with open(os.path.join(run_dir, "processes.jsonl")) as f:
            procs = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return None
    pids = [p["pid"] for p in procs if p.get("role") == "stage" and p.get("stage") == stage
            and not p.get("exited")]
    return pids[-1] if pids else None


class Receiver:
    """The OTLP/gRPC backend, stoppable and restartable on one port."""

    def __init__(self) -> None:
        self.store = Store()
        self.server, self.port = start_grpc(self.store)

    def down(self) -> None:
        self.server.stop(0).wait(10)

    def up(self) -> None:
        import grpc
        from concurrent import futures
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsvc_grpc
        from tests.support.otlp_receiver import _Trace
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        tsvc_grpc.add_TraceServiceServicer_to_server(_Trace(self.store), self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()


def _fault(kind: str, run_dir: str, disk: str, rx: Receiver, log: list) -> None:
    t0 = time.time()
    if kind == "agent":
        pid = json_or_empty(os.path.join(run_dir, "run.json")).get("agent_pid")
        os.kill(pid, signal.SIGKILL)
        log.append({"fault": kind, "unix_s": t0, "pid": pid})
    elif kind == "freeze":
        pid = _stage_pid(run_dir, 0)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(15)
        os.kill(pid, signal.SIGCONT)
        log.append({"fault": kind, "unix_s": t0, "pid": pid, "s": 15})
    elif kind == "otlp":
        rx.down()
        time.sleep(30)
        rx.up()
        log.append({"fault": kind, "unix_s": t0, "s": 30})
    elif kind == "disk":
        filler = os.path.join(disk, "filler")
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        time.sleep(20)
        os.unlink(filler)
        log.append({"fault": kind, "unix_s": t0, "s": 20})
    elif kind == "stage":
        pid = _stage_pid(run_dir, 1)
        os.kill(pid, signal.SIGKILL)
        log.append({"fault": kind, "unix_s": t0, "pid": pid})


def soak(minutes: float, concurrency: int, disk: str) -> dict:
    run_dir = os.path.join(disk, "run")
    rx = Receiver()
    env = {**os.environ, "PYTHONPATH": ROOT}
    from omnitrace.bench.serve_and_bench import free_port, wait_healthy
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", run_dir, "--planned-stop", "TERM",
                               "--exporter", "otlp-grpc", "--otlp-endpoint", f"127.0.0.1:{rx.port}",
                               "serve", "--port", str(port)], env=env, start_new_session=True,
                              stdout=open(os.path.join(disk, "..", "server.log"), "wb"), stderr=subprocess.STDOUT)
    why = wait_healthy(f"http://127.0.0.1:{port}", server, 180)
    if why:
        raise RuntimeError(f"the server did not start: {why}")
    bench_err = open(os.path.join(disk, "..", "bench.log"), "wb")
    bench = subprocess.Popen([sys.executable, "-m", "omnitrace", "bench", "--base-url", f"http://127.0.0.1:{port}",
                              "--concurrency", str(concurrency), "--num-prompts", str(int(minutes * 60 * 40)), "--input-len", "1500",
                              "--output-len", "60", "--request-timeout", "60", "--no-progress",
                              "--out", os.path.join(run_dir, "bench.json")],
                             env=env, stdout=bench_err, stderr=subprocess.STDOUT)
    try:
        return _faults_and_verdict(server, bench, rx, run_dir, disk, minutes, env)
    finally:
        for proc in (bench, server):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if proc is server else proc.kill()


def _faults_and_verdict(server: subprocess.Popen, bench: subprocess.Popen, rx: Receiver, run_dir: str,
                        disk: str, minutes: float, env: dict) -> dict:
    tree = descendants(server.pid)
    faults: list = []
    rss: list = []
    start = time.time()
    end = start + minutes * 60
    last = int(minutes) - 1  # the minute of the stage's death; one fault each minute before
    for n in range(1, last + 1):
        while time.time() < start + n * 60:
            pid = json_or_empty(os.path.join(run_dir, "run.json")).get("agent_pid")
            rss.append((time.time() - start, pid, _rss(pid) if pid else 0))
            time.sleep(5)
        kind = "stage" if n == last else CYCLE[(n - 1) % len(CYCLE)]
        if kind == "agent" and n * 60 > minutes * 60 * AGENT_KILLS_BEFORE:
            kind = CYCLE[n % len(CYCLE)]
        _fault(kind, run_dir, disk, rx, faults)
        tree |= descendants(server.pid)
    time.sleep(max(0.0, end - time.time()))
    bench.send_signal(signal.SIGINT)
    bench.wait(300)
    server.send_signal(signal.SIGTERM)
    server.wait(300)
    rx.down()
    rep = json.loads(subprocess.run([sys.executable, "-m", "omnitrace", "report", run_dir, "--json"], env=env,
                                    capture_output=True, text=True, timeout=900).stdout)
    return _verdict(rep, faults, rss, start, minutes, run_dir, tree, os.path.join(disk, "..", "bench.log"))


def _growth(samples: list[tuple[float, int, int]]) -> float | None:
    """One agent's resident memory over the window, as the least-squares trend across it
    relative to its mean (the RSS swings by tens of MB with each feed: its ends alone are
    noise); None if another agent took over within the window."""
    if len(samples) < 3 or len({p for _, p, _ in samples}) != 1:
        return None
    import numpy as np
    t, r = np.array([x[0] for x in samples]), np.array([x[2] for x in samples], float)
    return float(np.polyfit(t, r, 1)[0] * (t[-1] - t[0]) / r.mean())


def _verdict(rep: dict, faults: list, rss: list, start: float, minutes: float, run_dir: str,
             tree: set[int], bench_log: str) -> dict:
    acc = rep["recorder"]["accounting"]
    warnings = " | ".join(rep["warnings"])
    kinds = [f["fault"] for f in faults]
    with open(bench_log, errors="replace") as f:
        bench_text = f.read()
    named = {
        "agent": warnings.count("took over its rings") == kinds.count("agent"),
        "disk": "event log was out of service" in warnings,
        "otlp": "otlp-grpc export was out of service" in warnings,
        "stage": any(d.get("stage_id") == 1 for d in (rep.get("failures") or {}).get("stage_deaths", ())),
        "freeze": "no request has progressed" in bench_text or "stalled" in bench_text,
    }
    run_id = json_or_empty(os.path.join(run_dir, "run.json")).get("run_id", "?")
    growth = _growth([(t, p, r) for t, p, r in rss if t >= (minutes - 20) * 60 and r])
    return {"minutes": minutes, "faults": faults, "accounting": acc,
            "unexplained": acc["lost"] if not acc.get("lost_why") else 0, "closes": acc["closes"],
            "named": named, "shm_left": [x for x in os.listdir("/dev/shm") if run_id in x],
            "alive_left": sorted(alive(tree)), "agent_rss_growth_last_20min": growth,
            "agent_rss_mb": [(round(t), p, round(r / 2**20, 1)) for t, p, r in rss[::12]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--disk-mb", type=int, default=2048, help="the run directory's tmpfs")
    p.add_argument("--out", default="soak.json")
    a = p.parse_args()
    base = tempfile.mkdtemp(prefix="soak-")
    disk = os.path.join(base, "disk")
    os.makedirs(disk)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={a.disk_mb}m,mode=0700", "tmpfs", disk], check=True)
    try:
        res = soak(a.minutes, a.concurrency, disk)
        import shutil
        shutil.copytree(os.path.join(disk, "run"), os.path.join(base, "run"))
    finally:
        subprocess.run(["umount", "-l", disk], check=False)
    res["kept"] = base
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    ok = (res["closes"] and not res["unexplained"] and all(res["named"].values()) and not res["shm_left"]
          and not res["alive_left"] and (res["agent_rss_growth_last_20min"] or 0) <= 0.10)
    print(json.dumps({k: v for k, v in res.items() if k != "agent_rss_mb"}, indent=1))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
