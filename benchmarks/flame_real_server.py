"""`--flame` on the REAL vLLM-Omni server: did py-spy get the CPU, and do the seconds match?

    python benchmarks/flame_real_server.py --venv .venv-vllm [--rate 100] [--num-prompts 16]

Serves the tiny CPU Qwen3-Omni (``scripts/install-vllm-omni.sh --serve-cpu``) under
``omnitrace run --flame`` and loads it with ``omnitrace bench``. During the load it reads
every thread's ``/proc/PID/task/TID/schedstat`` (CPU time, time waiting on a run queue)
and state every 20 ms, of each py-spy and of omnitrace's agent. Then, from the run
directory: the agent's dropped events and longest drain lag (``agent.json``); py-spy's own
counts and the unsampled time per profile (``profiles/index.json``); the span-linked
selections' seconds against the exported spans' own time (``omnitrace flame --json``,
``omnitrace export --otlp-json``), and the same intervals placed at random (each shifted
by up to ±200 ms, 20 draws): the estimator's own spread, and whether the selection's real
placement reads differently from a random one; and whether the samples whose stack shows
the snapshot code were stamped inside the snapshot spans (sample times checked by what
py-spy read). ``--analyze RUN_DIR`` redoes only the selections on a kept run. Output:
markdown tables; figures go to benchmarks/flame_results.md.

"Longest starved" is the longest stretch a process's busiest thread (py-spy's sampling
thread, the agent's drain loop) stayed runnable ("R") without gaining CPU time: a thread
the scheduler does not run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tiny-omni"


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
    return env


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SchedWatch(threading.Thread):
    """Every thread's schedstat and state, every ``period`` s, of each py-spy and of
    omnitrace's agent (both run in the command's session: their scheduler autogroup)."""

    def __init__(self, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.period, self.stop, self.rows = period, threading.Event(), []
        self.kinds: dict[int, str] = {}

    @staticmethod
    def _watched() -> dict[int, str]:
        out = {}
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"py-spy"):
                out[int(p)] = "py-spy"
            elif b"omnitrace.cli.agent" in argv:
                out[int(p)] = "agent"
        return out

    def run(self) -> None:
        watched: dict[int, str] = {}
        listed = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now - listed > 1:
                watched, listed = self._watched(), now
                self.kinds.update(watched)
            for pid in watched:
                try:
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        base = f"/proc/{pid}/task/{tid}/"
                        with open(base + "stat") as f:
                            stat = f.read()
                        with open(base + "schedstat") as f:
                            cpu, wait = f.read().split()[:2]
                        self.rows.append((now, pid, int(tid), stat[stat.rindex(")") + 2], int(cpu), int(wait)))
                except (OSError, ValueError):
                    pass
            time.sleep(self.period)

    def per_process(self) -> list[dict]:
        """Per watched process, its busiest thread (py-spy's sampling thread, the agent's
        drain loop): CPU, run-queue wait, the longest stretch it stayed runnable without CPU."""
        by: dict[tuple[int, int], list[tuple]] = {}
        for r in self.rows:
            by.setdefault((r[1], r[2]), []).append(r)
        best: dict[int, list[tuple]] = {}
        for (pid, _), rs in by.items():
            if pid not in best or rs[-1][4] - rs[0][4] > best[pid][-1][4] - best[pid][0][4]:
                best[pid] = rs
        out = []
        for pid, rs in sorted(best.items()):
            starved = longest = 0.0
            for a, b in zip(rs, rs[1:]):
                starved = starved + b[0] - a[0] if a[3] == "R" and b[4] == a[4] else 0.0
                longest = max(longest, starved)
            out.append({"pid": pid, "kind": self.kinds.get(pid, "?"), "watched_s": rs[-1][0] - rs[0][0],
                        "cpu_s": (rs[-1][4] - rs[0][4]) / 1e9, "runqueue_s": (rs[-1][5] - rs[0][5]) / 1e9,
                        "longest_starved_s": longest})
        return out


def _ot(venv: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "omnitrace"), *args], env=_env(venv), text=True,
                          capture_output=True, timeout=timeout)


def _span_time(venv: Path, run_dir: Path) -> dict[int, float]:
    """Exported omni.chunk.snapshot spans' total seconds per stage."""
    out = run_dir / "spans.otlp.json"
    ex = _ot(venv, "export", str(run_dir), "--otlp-json", str(out))
    if ex.returncode:
        sys.exit(ex.stderr[-2000:])
    tot: dict[int, float] = {}
    for line in out.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    if sp["name"] != "omni.chunk.snapshot":
                        continue
                    stage = next(int(next(iter(a["value"].values()))) for a in sp["attributes"]
                                 if a["key"] == "omni.stage.id")
                    dur = int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])
                    tot[stage] = tot.get(stage, 0.0) + dur / 1e9
    return tot


def _selection(venv: Path, run_dir: Path, *args: str) -> dict:
    fl = _ot(venv, "flame", str(run_dir), *args, "-o", str(run_dir / "sel"), "--json")
    if fl.returncode:
        sys.exit(fl.stderr[-2000:])
    return json.loads(fl.stdout)


def _placed_at_random(run_dir: Path, category: str, stage: str, thread: str | None, request: str | None,
                      draws: int = 20) -> tuple[float, float]:
    """Mean and spread of seconds / covered time with every interval shifted at random."""
    import dataclasses

    import numpy as np

    from omnitrace.profile import linked
    store = linked.profiles_store(str(run_dir))
    iv, _ = linked.intervals(str(run_dir), category, stage, request, thread)
    rng, ratios = np.random.default_rng(0), []
    for _ in range(draws):
        d = rng.integers(-200_000_000, 200_000_000, len(iv.start))
        moved = dataclasses.replace(iv, start=iv.start + d, end=iv.end + d)
        ratios.append(linked.select_time(store, moved)[1].sum() / (linked.covered_ns(moved) / 1e9))
    return float(np.mean(ratios)), float(np.std(ratios))


def _stamps_against_stacks(run_dir: Path, stage: str, code: str = "snapshot") -> str:
    """Of the samples on the stage's scheduler thread whose stack shows ``code`` (a frame
    name containing it), how many py-spy stamped inside the stage's snapshot spans, and
    how far outside the others fell: whether sample times land right on sub-ms spans,
    checked by what py-spy read rather than by when."""
    import numpy as np

    from omnitrace.profile import linked
    store = linked.profiles_store(str(run_dir))
    iv, _ = linked.intervals(str(run_dir), "snapshot", stage)
    if not len(iv.start):
        return "no spans"
    pid, tid, a, b = next(linked.thread_unions(iv))  # snapshots run on one thread
    mask = (store.stretches["pid"] == pid) & (store.stretches["tid"] == tid)
    idx, t = store.samples(mask)
    shows = np.array([any(code in store.frames[f][0] for f in store.stacks[s])
                      for s in store.stretches["stack"][idx]], bool)
    j = np.searchsorted(a, t, "right") - 1
    inside = (j >= 0) & (t < b[np.maximum(j, 0)])
    k = np.minimum(np.searchsorted(a, t), len(a) - 1)
    far = np.minimum(np.abs(t - b[np.maximum(j, 0)]), np.abs(a[k] - t))[shows & ~inside] / 1e6
    return (f"{int((shows & inside).sum())} of {int(shows.sum())} inside"
            + (f", the rest within {np.median(far):.2f} ms (median)" if len(far) else ""))


def analyze(venv: Path, run_dir: Path) -> None:
    snap = _span_time(venv, run_dir)
    rid = next(r["id"] for r in json.loads((run_dir / "bench.json").read_text())["requests"]
               if not r.get("warmup") and not r.get("error"))
    rows = [("thinker snapshot", "snapshot", "thinker", None, None, snap.get(0)),
            ("talker snapshot", "snapshot", "talker", None, None, snap.get(1)),
            ("thinker fifo_blocked, sender", "fifo_blocked", "thinker", "sender", None, None),
            ("thinker compute", "compute", "thinker", None, None, None),
            ("talker compute", "compute", "talker", None, None, None),
            ("thinker compute, one request", "compute", "thinker", None, rid, None)]
    print("\n| selection | samples | seconds | spans' time s | ratio | ± stated | placed at random: ratio ± sd |"
          " unsampled s |\n|---|---|---|---|---|---|---|---|")
    for name, category, stage, thread, request, truth in rows:
        args = ["--stage", stage, "--category", category] + (["--thread", thread] if thread else []) \
            + (["--request", request] if request else [])
        sel = _selection(venv, run_dir, *args)
        truth = truth if truth is not None else sel["interval_s"]
        mean, sd = _placed_at_random(run_dir, category, stage, thread, request)
        print(f"| {name} | {sel['samples']} | {sel['sampled_s']:.3f} | {truth:.3f} | {sel['sampled_s'] / truth:.3f} | "
              f"{sel.get('sampling_error_pct')}% | {mean:.3f} ± {sd:.3f} | {sel['unsampled_s']:.3f} |")
    print("\nSamples whose stack shows `snapshot`, stamped inside the snapshot spans: "
          + "; ".join(f"{st} {_stamps_against_stacks(run_dir, st)}" for st in ("thinker", "talker")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"))
    ap.add_argument("--rate", default="100")
    ap.add_argument("--num-prompts", default="16")
    ap.add_argument("--concurrency", default="4")
    ap.add_argument("--output-len", default="16")
    ap.add_argument("--flame-tool", default=None, help="passed to omnitrace run (e.g. a wrapper: chrt, nice)")
    ap.add_argument("--keep", default=None, help="run directory's parent (default: a temporary one)")
    ap.add_argument("--analyze", default=None, metavar="RUN_DIR", help="only the selections, of a kept run")
    ns = ap.parse_args()
    venv = Path(ns.venv).resolve()
    if ns.analyze:
        analyze(venv, Path(ns.analyze))
        return
    tiny = venv / "tiny-qwen3-omni"
    work = Path(ns.keep or tempfile.mkdtemp(prefix="flame-real-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir, port = work / "run", _free_port()
    from omnitrace.bench.serve_and_bench import wait_healthy
    with open(work / "server.log", "wb") as log:
        server = subprocess.Popen(
            [str(venv / "bin" / "omnitrace"), "run", "--run-dir", str(run_dir), "--flame", "--flame-rate", ns.rate,
             *(["--flame-tool", ns.flame_tool] if ns.flame_tool else []),
             "serve", str(tiny / "model"), "--port", str(port), "--deploy-config", str(tiny / "deploy.yaml"),
             "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16", "--served-model-name", MODEL,
             "--stage-init-timeout", "900"], env=_env(venv), stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            why = wait_healthy(url, server, 1200)
            if why:
                sys.exit(f"{why}: see {work / 'server.log'}")
            watch = SchedWatch()
            watch.start()
            bench = _ot(venv, "bench", "--base-url", url, "--model", MODEL, "--concurrency", ns.concurrency,
                        "--num-prompts", ns.num_prompts, "--warmup", "4", "--input-len", "300",
                        "--output-len", ns.output_len, "--request-timeout", "180",
                        "--out", str(run_dir / "bench.json"), timeout=3600)
            watch.stop.set()
            watch.join()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(300)
    print(f"run: {run_dir} (bench rc {bench.returncode})\n")
    print("| process | pid | watched s | busiest thread: CPU s | run-queue wait s | longest starved s |\n"
          "|---|---|---|---|---|---|")
    for r in watch.per_process():
        print(f"| {r['kind']} | {r['pid']} | {r['watched_s']:.1f} | {r['cpu_s']:.2f} | {r['runqueue_s']:.2f} | "
              f"{r['longest_starved_s']:.2f} |")
    agent = json.loads((run_dir / "agent.json").read_text())
    print(f"\nagent: {agent.get('events_read')} events read, {agent.get('events_dropped')} dropped, "
          f"longest drain lag {agent.get('max_drain_lag_ms')} ms, longest drain cycle {agent.get('max_cycle_ms')} ms")
    index = json.loads((run_dir / "profiles" / "index.json").read_text())
    print("\n| profile | rounds written | py-spy behind (times, max s) | unsampled s |\n|---|---|---|---|")
    for p in index["profiles"]:
        print(f"| {p['name']} | {p.get('rounds_known')} | {p.get('pyspy_behind', 0)}, "
              f"{p.get('pyspy_behind_max_s', 0)} | {p.get('unsampled_s')} |")
    analyze(venv, run_dir)


if __name__ == "__main__":
    main()
