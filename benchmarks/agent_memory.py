"""Agent memory over a long run: `omnitrace run serve` under a closed-loop load.

    python benchmarks/agent_memory.py [--duration 600] [--concurrency 32] [--json OUT]

Starts the reference pipeline under `omnitrace run` (file exporter), drives it with
`--concurrency` streaming clients for `--duration` seconds (random prompt 64..512
tokens, max_tokens 8..48), samples the agent's RSS (VmRSS) every 5 s, then stops
the run and reads agent.json. Bounded memory means: RSS flat after warm-up while
events and spans keep growing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import aiohttp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from omnitrace import eventlog  # noqa: E402


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def _client(url: str, stop_at: float, rng: random.Random, stats: dict, idx: int) -> None:
    async with aiohttp.ClientSession() as s:
        n = 0
        while time.monotonic() < stop_at:
            body = {"model": "ref", "stream": True, "max_tokens": rng.randint(8, 48),
                    "omnitrace_prompt_tokens": rng.randint(64, 512),
                    "messages": [{"role": "user", "content": "x"}]}
            rid = f"mem-{idx}-{n}"
            n += 1
            try:
                async with s.post(url, json=body, headers={"x-request-id": rid}) as r:
                    async for _ in r.content:
                        pass
                    stats["ok" if r.status == 200 else "http_error"] += 1
            except aiohttp.ClientError:
                stats["client_error"] += 1


def _agent_json(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "agent.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


async def _sample(agent_pid: int, t0: float, stop_at: float, samples: list, stats: dict,
                  run_dir: str) -> None:
    while time.monotonic() < stop_at:
        a = _agent_json(run_dir)
        samples.append({"t_s": round(time.monotonic() - t0, 1), "rss_bytes": _rss(agent_pid),
                        "agent_cpu_s": _cpu_s(agent_pid), "requests_ok": stats["ok"],
                        "events_read": a.get("events_read"),
                        "events_dropped": a.get("events_dropped"),
                        "view_backlog_events": (a.get("views") or {}).get("backlog_events")})
        sm = samples[-1]
        print(f"t={sm['t_s']:>6}s agent RSS {sm['rss_bytes'] / 2**20:7.1f} MiB "
              f"cpu {sm['agent_cpu_s']:7.1f} s requests {stats['ok']} "
              f"read {sm['events_read']} dropped {sm['events_dropped']} "
              f"view backlog {sm['view_backlog_events'] or 0} events "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        await asyncio.sleep(5)


async def _load(port: int, agent_pid: int, duration: float, conc: int, samples: list,
                run_dir: str) -> dict:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    stats = {"ok": 0, "http_error": 0, "client_error": 0}
    t0 = time.monotonic()
    stop_at = t0 + duration
    rng = random.Random(0)
    await asyncio.gather(_sample(agent_pid, t0, stop_at, samples, stats, run_dir),
                         *[_client(url, stop_at, random.Random(rng.random()), stats, i)
                           for i in range(conc)])
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--agent-nice", type=int, default=0,
                    help="renice the agent by this much (simulates a CPU-starved agent)")
    args = ap.parse_args(argv)
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OMNITRACE_"))}
        proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", run_dir,
                                 "serve", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.3)
            agent_pid = json.load(open(os.path.join(run_dir, "run.json")))["agent_pid"]
            if args.agent_nice:
                os.setpriority(os.PRIO_PROCESS, agent_pid, args.agent_nice)  # main thread
                for tid in os.listdir(f"/proc/{agent_pid}/task"):  # and its drain thread
                    os.setpriority(os.PRIO_PROCESS, int(tid), args.agent_nice)
            samples: list = []
            stats = asyncio.run(_load(port, agent_pid, args.duration, args.concurrency, samples,
                                      run_dir))
            final_rss = _rss(agent_pid)
            agent_cpu = _cpu_s(agent_pid)
            load = os.getloadavg()
        finally:
            t_stop = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # the agent's final drain and views before it exits
            proc.wait(3600)
            stop_s = time.monotonic() - t_stop
        agent = json.load(open(os.path.join(run_dir, "agent.json")))
        log_bytes = sum(os.path.getsize(p) for p in eventlog.segments(run_dir))
    rss = [s["rss_bytes"] for s in samples]
    after_warmup = [s["rss_bytes"] for s in samples if s["t_s"] >= 60] or rss
    out = {
        "duration_s": args.duration, "concurrency": args.concurrency, "requests": stats,
        "agent_nice": args.agent_nice,
        "agent_rss_mib": {"first": round(rss[0] / 2**20, 1), "max": round(max(rss) / 2**20, 1),
                          "after_60s_min": round(min(after_warmup) / 2**20, 1),
                          "after_60s_max": round(max(after_warmup) / 2**20, 1),
                          "final": round(final_rss / 2**20, 1)},
        "agent": {k: agent.get(k) for k in ("events_read", "events_dropped", "spans_built",
                                            "spans_incomplete", "requests_freed", "requests_open",
                                            "max_cycle_ms", "max_rss_bytes", "state",
                                            "max_drain_lag_ms", "drain_lag_ms_counts", "record",
                                            "views", "final_s")},
        "stop_to_exit_s": round(stop_s, 1),
        "load_average_at_end": [round(x, 2) for x in load],
        "event_log_mib": round(log_bytes / 2**20, 1),
        "agent_cpu_s_during_load": round(agent_cpu, 1),
        "agent_cores_during_load": round(agent_cpu / args.duration, 2),
        "samples": samples,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
