"""Observer cost on the REAL vLLM-Omni server, in CPU-seconds per request.

    python benchmarks/vllm_serve_cpu.py --venv .venv-vllm-032 [--rounds 3] [--requests 16]

Two servers of the same venv run side by side on the tiny CPU Qwen3-Omni
(``scripts/install-vllm-omni.sh --serve-cpu``): one bare (``vllm serve``), one under
``omnitrace run``. They take the same load in turn, in ABBA order repeated ``--rounds``
times (``omnitrace bench``, one window each); around each window the CPU time
(utime + stime from /proc/PID/stat) of every process of the loaded server is read, by
role (API server, each stage's EngineCore, the workers, omnitrace's agent). CPU time is
what neighbours on a shared machine disturb least (throughput moves +-20% here by
itself). Output: per role, bare and instrumented ms of CPU per request (medians over
windows) and the difference with a 95% bootstrap CI over rounds; the agent's own CPU per
request. Figures go to benchmarks/vllm_serve_results.md.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids[ppid].append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def _role(pid: int) -> str | None:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    for tag, role in (("stage0", "thinker"), ("stage1", "talker"), ("stage2", "code2wav")):
        if "StageEngineCoreProc_" + tag in cmd:
            return role
    if "omnitrace.agent" in cmd:
        return "agent"
    if "Worker" in cmd:
        return "workers"
    if "vllm serve" in cmd or "bin/vllm" in cmd:
        return "api"
    if "resource_tracker" in cmd or "omnitrace run" in cmd or "bin/omnitrace" in cmd:
        return "other"
    return "workers" if "VLLM" in cmd else "other"


def cpu_by_role(root: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for pid in _tree(root):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = _role(pid)
        if role:
            out[role] += (int(fields[11]) + int(fields[12])) / TICK
    return out


def _serve_cmd(venv: Path, port: int, run_dir: str | None) -> list[str]:
    t = venv / "tiny-qwen3-omni"
    serve = [str(venv / "bin" / "vllm"), "serve", str(t / "model"), "--omni", "--host", "127.0.0.1",
             "--port", str(port), "--deploy-config", str(t / "deploy.yaml"), "--load-format", "dummy",
             "--enforce-eager", "--dtype", "bfloat16", "--served-model-name", "tiny-omni"]
    if run_dir is None:
        return serve
    return [str(venv / "bin" / "omnitrace"), "run", "--run-dir", run_dir, "--", *serve]


def _env(venv: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
               OMP_NUM_THREADS="1")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _wait(port: int, proc: subprocess.Popen, timeout_s: float = 1500) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"a server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(2)
    sys.exit(f"server on {port} not ready in {timeout_s} s")


def _load(venv: Path, port: int, n: int, c: int, tag: str, work: str) -> None:
    out = os.path.join(work, f"bench-{tag}.json")
    subprocess.run([str(venv / "bin" / "omnitrace"), "bench", "--base-url", f"http://127.0.0.1:{port}",
                    "--model", "tiny-omni", "--concurrency", str(c), "--num-prompts", str(n), "--warmup", "0",
                    "--input-len", "300", "--output-len", "16", "--seed", str(abs(hash(tag)) % 10000),
                    "--out", out], env=_env(venv), check=True, capture_output=True, timeout=1800)


def stop_servers(procs: list[subprocess.Popen], started_unix_s: float) -> None:
    """SIGTERM each server's process group, SIGKILL what is left after 180 s, then remove
    what vLLM-Omni leaves in /dev/shm even on a clean stop (its stages' wake directories;
    `omnitrace run` sweeps its own server's, the bare one has nobody to)."""
    from omnitrace.inject import leftovers
    pids = {pid for p in procs for pid in _tree(p.pid)}
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    leftovers.sweep(pids, started_unix_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm-032"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    venv = Path(args.venv).resolve()
    work = tempfile.mkdtemp(prefix="vllm-serve-cpu-")
    ports = {"bare": 18801, "omnitrace": 18802}
    procs = {"bare": subprocess.Popen(_serve_cmd(venv, ports["bare"], None), env=_env(venv),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True),
             "omnitrace": subprocess.Popen(_serve_cmd(venv, ports["omnitrace"], os.path.join(work, "run")),
                                           env=_env(venv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)}
    per: dict[str, list[dict[str, float]]] = {"bare": [], "omnitrace": []}
    started = time.time()
    try:
        for v in procs:
            _wait(ports[v], procs[v])
        for v in procs:  # warm-up, not measured
            _load(venv, ports[v], 4, args.concurrency, f"{v}-warm", work)
        for i, v in enumerate(["bare", "omnitrace", "omnitrace", "bare"] * args.rounds):
            before = cpu_by_role(procs[v].pid)
            _load(venv, ports[v], args.requests, args.concurrency, f"{v}-{i}", work)
            after = cpu_by_role(procs[v].pid)
            per[v].append({r: (after[r] - before.get(r, 0.0)) / args.requests * 1e3 for r in after})
            print(f"window {i + 1}: {v}: " + ", ".join(f"{r} {x:.1f}" for r, x in sorted(per[v][-1].items())),
                  file=sys.stderr)
    finally:
        stop_servers(list(procs.values()), started)
    _print(per, args)
    try:
        import json
        agent = json.loads(Path(work, "run", "agent.json").read_text())
        n = 4 + 2 * args.rounds * args.requests
        print(f"events recorded: {agent['events_read']} for {n} requests ({agent['events_read'] / n:.0f} per request)")
    except (OSError, KeyError, ValueError):
        pass
    return 0


def _print(per: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    roles = ["api", "thinker", "talker", "code2wav", "workers"]
    print(f"CPU ms per request ({args.requests} requests per window, c={args.concurrency}, "
          f"{args.rounds} ABBA rounds; medians, difference with 95% bootstrap CI over window pairs)")
    print("| role | bare | omnitrace | difference |\n|---|---|---|---|")
    tot_b = np.array([sum(w.get(r, 0) for r in roles) for w in per["bare"]])
    tot_o = np.array([sum(w.get(r, 0) for r in roles) for w in per["omnitrace"]])
    for r in roles + ["pipeline (sum)"]:
        b = tot_b if r.startswith("pipeline") else np.array([w.get(r, 0.0) for w in per["bare"]])
        o = tot_o if r.startswith("pipeline") else np.array([w.get(r, 0.0) for w in per["omnitrace"]])
        d = o - b
        boots = [rng.choice(d, len(d)).mean() for _ in range(2000)]
        lo, hi = np.percentile(boots, [2.5, 97.5])
        print(f"| {r} | {np.median(b):.1f} | {np.median(o):.1f} | {d.mean():+.1f} [{lo:+.1f}, {hi:+.1f}] "
              f"({100 * d.mean() / max(np.median(b), 1e-9):+.1f}%) |")
    agent = [w.get("agent", 0.0) for w in per["omnitrace"]]
    print(f"| agent (omnitrace's own process) | — | {np.median(agent):.1f} | |")


if __name__ == "__main__":
    sys.exit(main())
