"""What does watching cost in CPU? CPU-seconds per request and per recorded event, per
process role, bare against instrumented, in alternating rounds.

Throughput is the wrong instrument on a small shared machine (it moves +-20% between
rounds by itself); the CPU a process spent is disturbed far less by neighbours. Per round
and variant, a fresh server:

1. warm-up load (``--warmup`` requests), then wait until the agent has read every ring;
2. CPU of every process of the run (utime + stime, ``/proc/PID/stat``, which keeps the
   time of exited threads) and the events every ring's hook sites wrote (ring headers:
   ``write - string slots + dropped``);
3. the measured load (``--num-prompts`` requests, no warm-up), then the same wait;
4. CPU and events again. Per role: CPU delta / measured requests; events likewise.

Roles: ``api`` (the server process), ``stage0..N`` (its stage processes in spawn order =
pipeline order; named from the rings where there are rings), ``agent``, ``py-spy``,
``flame-runner`` (``--flame``'s supervisor of the py-spys, the server's parent), ``run``
(the `omnitrace run` supervisor), ``other`` (multiprocessing's resource tracker).
Variants: ``bare`` (`omnitrace serve`), ``omnitrace`` (`omnitrace run serve`),
``omnitrace-py`` (the same with the Python ring writer, ``OMNITRACE_RECORD_WRITER=python``),
``flame-nb``/``flame-b`` (``--flame`` nonblocking/blocking; ``flame-nb:10`` at
``--flame-rate 10``).
``pipeline`` = api + stages: what the server itself spends, the in-situ figure.

``--tree NAME=PATH`` adds the variant ``omnitrace@NAME``: `omnitrace run` from another
checkout (e.g. ``git worktree add /tmp/base HEAD~1``), to compare two versions of the
agent and hooks in one run. Any variant can name a tree (``--variants
omnitrace,flame-nb,flame-nb@base --tree base=PATH``): then only the named ones run from it,
and each is also paired with the same variant of this checkout (before against after).

Each round also records the bench client's CPU per request and the machine-speed probe's
median burst (``speed_probe``, run during the measured load); a flame variant's difference
against ``omnitrace`` is shown again with the probe's drift regressed out.

``--request-rate R`` sends the loads as an open loop at R requests per second (``omnitrace
bench --request-rate``): below saturation every variant serves the same load in the same
time, so what one makes slower no longer spreads the per-second costs over fewer requests.

Deltas against ``bare`` per round (the rounds pair up: variants run in rotating,
alternately reversed order), 95% bootstrap CIs over rounds.

    python benchmarks/observer_cpu.py --rounds 5 --concurrency 16 --num-prompts 96 \\
        --warmup 16 --input-len 1500 --output-len 60 [--variants bare,omnitrace,flame-nb]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import speed_probe  # noqa: E402
from observer_effect import _server_cmd, bench_cmd, stop_server  # noqa: E402
from omnitrace import record  # noqa: E402
from omnitrace.bench.serve_and_bench import free_port, wait_healthy  # noqa: E402

ALL = ("bare", "omnitrace", "omnitrace-py", "flame-nb", "flame-b")
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _tree(root: int) -> dict[int, tuple[int, float]]:
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (s := _stat(int(d))):
            procs[int(d)] = s
    keep, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            keep[pid] = procs[pid]
            todo += [c for c, (pp, _) in procs.items() if pp == pid]
    return keep


def _role(pid: int, root: int, instrumented: bool) -> str:
    cmd = _cmdline(pid)
    if "omnitrace.cli.agent" in cmd:
        return "agent"
    if "py-spy" in cmd.split(" ", 1)[0] or os.path.basename(cmd.split(" ", 1)[0]) == "py-spy":
        return "py-spy"
    if "omnitrace.profile.runner" in cmd:  # --flame's supervisor of the py-spys: not the server
        return "flame-runner"
    if "resource_tracker" in cmd:
        return "other"
    if "multiprocessing.spawn" in cmd:
        return "stage"
    if pid == root and instrumented:
        return "run"
    return "api"


def cpu_by_role(root: int, instrumented: bool) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds) for every process under ``root``; stages numbered by pid."""
    out = {pid: (_role(pid, root, instrumented), cpu) for pid, (_, cpu) in _tree(root).items()}
    stages = sorted(p for p, (r, _) in out.items() if r == "stage")
    for i, pid in enumerate(stages):
        out[pid] = (f"stage{i}", out[pid][1])
    return out


def _rings(run_id: str) -> list[record.RingHeader]:
    heads = []
    for name in record.discover(run_id):
        try:
            r = record.RingReader(name)
        except (OSError, ValueError):
            continue
        heads.append(r.header())
        r.close()
    return heads


def _run_id(run_dir: str) -> str | None:
    try:
        with open(os.path.join(run_dir, "run.json")) as f:
            return json.load(f)["run_id"]
    except (OSError, ValueError, KeyError):
        return None


def _settle(run_id: str | None, timeout_s: float = 30.0) -> None:
    """Wait until the agent has read every ring of the run (its CPU for the load is spent)."""
    if run_id is None:
        time.sleep(0.5)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(h.read >= h.write for h in _rings(run_id)):
            time.sleep(0.3)  # the agent's work on the last batch after its read
            return
        time.sleep(0.1)


def _bench(port: int, args: argparse.Namespace, n: int, out: str, env: dict) -> tuple[dict, float]:
    """bench.json of the load, and the client's CPU seconds (its rusage once reaped: the only
    child reaped meanwhile; the server is reaped at its stop)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(bench_cmd(port, args, "--num-prompts", str(n), "--warmup", "0", "--overwrite", "--out", out),
                   env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out) as f:
        return json.load(f), (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def run_one(variant: str, args: argparse.Namespace, work: str) -> dict:
    port = free_port()
    run_dir = os.path.join(work, f"{variant}-{time.time_ns()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNITRACE_")}
    base, _, tree = variant.partition("@")
    if base == "omnitrace-py":  # the hooks write through the Python reference writer
        env["OMNITRACE_RECORD_WRITER"] = "python"
    if tree:  # that checkout's omnitrace first on the path (the agent's and the stages' too)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.trees[tree], env.get("PYTHONPATH")) if p)
    server = subprocess.Popen(_server_cmd(base, port, run_dir, args.serve.split()), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    instrumented = variant != "bare"
    try:
        why = wait_healthy(f"http://127.0.0.1:{port}", server, 180)
        if why:
            raise RuntimeError(f"{variant}: {why}")
        _bench(port, args, args.warmup, os.path.join(work, "warm.json"), env)
        rid = _run_id(run_dir) if instrumented else None
        _settle(rid)
        cpu0, ev0 = cpu_by_role(server.pid, instrumented), _rings(rid) if rid else []
        probe = speed_probe.start()
        try:
            doc, client_s = _bench(port, args, args.num_prompts, os.path.join(work, "measured.json"), env)
        finally:
            probe_us = speed_probe.stop(probe)
        _settle(rid)
        cpu1, ev1 = cpu_by_role(server.pid, instrumented), _rings(rid) if rid else []
    finally:
        stop_server(server)
    quality = flame_quality(run_dir) if base.startswith("flame") else None
    reqs = [r for r in doc["requests"] if not r.get("error")]
    n = len(doc["requests"])
    roles: dict[str, float] = {}
    for pid, (role, cpu) in cpu1.items():
        roles[role] = roles.get(role, 0.0) + (cpu - cpu0.get(pid, (role, 0.0))[1]) / n
    names = {}
    for h in ev1:
        names.setdefault(h.pid, h.process)
    stage_names = {role: names.get(pid, role) for pid, (role, _) in cpu1.items() if role.startswith("stage")}
    before = {h.name: h.events_written for h in ev0}
    events = sum(h.events_written - before.get(h.name, 0) for h in ev1) / n
    win = doc["levels"][0]["measured_window"]
    wall = (int(win["end_unix_ns"]) - int(win["start_unix_ns"])) / 1e9
    return {"variant": variant, "requests": n, "failed": n - len(reqs), "cpu_ms_per_request":
            {k: v * 1e3 for k, v in roles.items()}, "events_per_request": events,
            "stage_names": stage_names, "client_cpu_ms_per_request": client_s * 1e3 / n,
            "probe_us": probe_us, "throughput": len(reqs) / wall if wall > 0 else 0.0,
            "ttfp_p50_ms": float(np.percentile([r["ttfp_s"] for r in reqs if r.get("ttfp_s")], 50)) * 1e3,
            "flame_quality": quality}


def flame_quality(run_dir: str) -> dict | None:
    """What the clock calibration gave (``profiles/index.json``, written at the run's end):
    medians over py-spy's chunks and the profiled processes."""
    try:
        with open(os.path.join(run_dir, "profiles", "index.json")) as f:
            index = json.load(f)
    except (OSError, ValueError):
        return None
    chunks = [c for c in index.get("clock", []) if "chunk" in c]
    cal = [c for c in chunks if c.get("calibrated")]
    med = lambda xs: float(np.median(xs)) if xs else float("nan")  # noqa: E731
    return {"calibrated_share": len(cal) / len(chunks) if chunks else float("nan"),
            "uncertainty_ms": med([c["uncertainty_ms"] for c in cal]),
            "agreeing_share": med([c["agreeing"] / c["clock_samples"] for c in cal if c.get("clock_samples")]),
            "late_share": med([c.get("late_rounds", 0) / max(1, c["clock_samples"]) for c in cal]),
            "rounds_known": med([p["rounds_known"] for p in index.get("profiles", []) if p.get("rounds_known")]),
            "unsampled_s": sum(p.get("unsampled_s", 0.0) for p in index.get("profiles", []))}


def pipeline_ms(r: dict) -> float:
    return sum(v for k, v in r["cpu_ms_per_request"].items() if k == "api" or k.startswith("stage"))


def _ci(values: list[float], rng: np.random.Generator, n: int = 4000) -> tuple[float, float, float]:
    """Mean over rounds and its 95% bootstrap CI (rounds resampled)."""
    x = np.asarray(values, dtype=float)
    boots = x[rng.integers(0, len(x), (n, len(x)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(x.mean()), float(lo), float(hi)


def _speed_adjusted(rs: list[dict], ref: list[dict], rng: np.random.Generator,
                    n: int = 4000) -> tuple[tuple, tuple]:
    """The machine-speed probe's own paired difference (% ; ~0 if the variant leaves the
    probe alone, which the adjustment assumes), and the pipeline's paired difference with
    the probe's drift regressed out: mean(y - theta * x), theta = cov(y, x) / var(x) fitted
    again in every bootstrap resample of the rounds (``speed_probe``'s docstring)."""
    y = np.array([(pipeline_ms(r) - pipeline_ms(o)) / pipeline_ms(o) * 100 for r, o in zip(rs, ref)])
    x = np.array([(r["probe_us"] / o["probe_us"] - 1) * 100 for r, o in zip(rs, ref)])

    def adjusted(ys: np.ndarray, xs: np.ndarray) -> float:
        var = xs.var()
        theta = np.cov(ys, xs, bias=True)[0, 1] / var if var > 0 else 0.0
        return float((ys - theta * xs).mean())
    idx = rng.integers(0, len(y), (n, len(y)))
    boots = np.array([adjusted(y[i], x[i]) for i in idx])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return _ci(list(x), rng), (adjusted(y, x), float(lo), float(hi))


def summarise(results: dict[str, list[dict]], rng: np.random.Generator) -> list[dict]:
    rows = []
    bare = results.get("bare")  # without it, only the figures paired with omnitrace's rounds
    for v, rs in results.items():
        roles = sorted({k for r in rs for k in r["cpu_ms_per_request"]})
        row = {"variant": v, "rounds": len(rs),
               "cpu_ms_per_request": {k: float(np.median([r["cpu_ms_per_request"].get(k, 0.0) for r in rs]))
                                      for k in roles},
               "pipeline_ms": float(np.median([pipeline_ms(r) for r in rs])),
               "events_per_request": float(np.median([r["events_per_request"] for r in rs])),
               "throughput": float(np.median([r["throughput"] for r in rs])),
               "ttfp_p50_ms": float(np.median([r["ttfp_p50_ms"] for r in rs])),
               "failed": sum(r["failed"] for r in rs)}
        if v != "bare" and bare:
            added = [pipeline_ms(r) - pipeline_ms(b) for r, b in zip(rs, bare)]
            row["pipeline_added_ms"] = _ci(added, rng)
            row["pipeline_added_pct"] = _ci([a / pipeline_ms(b) * 100 for a, b in zip(added, bare)], rng)
            row["pipeline_added_us_per_event"] = _ci(
                [a * 1e3 / r["events_per_request"] for a, r in zip(added, rs)], rng)
        if v != "bare":
            for role in ("agent", "py-spy", "flame-runner"):
                if any(role in r["cpu_ms_per_request"] for r in rs):
                    row[f"{role}_us_per_event"] = _ci(
                        [r["cpu_ms_per_request"].get(role, 0.0) * 1e3 / r["events_per_request"] for r in rs], rng)
            ref = results.get("omnitrace")
            if ref and v != "omnitrace":  # --flame or another checkout, paired with omnitrace's round
                row["pipeline_added_vs_omnitrace_pct"] = _ci(
                    [(pipeline_ms(r) - pipeline_ms(o)) / pipeline_ms(o) * 100 for r, o in zip(rs, ref)], rng)
                same = results.get(v.partition("@")[0])
                if "@" in v and same:  # this checkout's same variant against that tree's: after / before
                    row["pipeline_this_vs_tree_pct"] = _ci(
                        [(pipeline_ms(a) - pipeline_ms(b)) / pipeline_ms(b) * 100 for a, b in zip(same, rs)], rng)
                if all("probe_us" in r for r in rs + ref):
                    row["probe_vs_omnitrace_pct"], row["pipeline_vs_omnitrace_speed_adjusted_pct"] = \
                        _speed_adjusted(rs, ref, rng)
                row["agent_vs_omnitrace_pct"] = _ci(
                    [(r["cpu_ms_per_request"].get("agent", 0) / o["cpu_ms_per_request"]["agent"] - 1) * 100
                     for r, o in zip(rs, ref)], rng)
        rows.append(row)
    return rows


def _fmt(ci: tuple | None, unit: str = "") -> str:
    return "—" if ci is None else f"{ci[0]:+.2f}{unit} [{ci[1]:+.2f}, {ci[2]:+.2f}]"


def print_quality(results: dict[str, list[dict]]) -> None:
    """The clock calibration's figures per flame variant: medians over rounds."""
    for v, rs in results.items():
        qs = [r["flame_quality"] for r in rs if r.get("flame_quality")]
        if qs:
            print(f"{v} calibration ({len(qs)} rounds, medians): " + ", ".join(
                f"{k} {np.nanmedian([q[k] for q in qs]):.4g}" for k in qs[0]))


def _run_rounds(variants: list[str], args: argparse.Namespace) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="observer-cpu-") as work:
        for rnd in range(args.rounds):
            shift = rnd % len(variants)
            order = variants[shift:] + variants[:shift]
            order = order[::-1] if rnd % 2 else order
            for v in order:
                r = run_one(v, args, work)
                results[v].append(r)
                print(f"round {rnd + 1} {v:<9} pipeline {pipeline_ms(r):6.1f} ms/req  "
                      f"agent {r['cpu_ms_per_request'].get('agent', 0):5.2f}  "
                      f"py-spy {r['cpu_ms_per_request'].get('py-spy', 0):5.2f}  "
                      f"events/req {r['events_per_request']:7.0f}  {r['throughput']:5.2f} req/s  "
                      f"client {r['client_cpu_ms_per_request']:5.2f}  probe {r['probe_us']:6.1f} us",
                      file=sys.stderr, flush=True)
            if args.json:  # every finished round, so a run stopped early can still be summarised
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "rounds": results}, f)
    return results


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> list[dict]:
    n = min(len(rs) for rs in results.values())  # whole rounds only: they pair up
    results = {v: rs[:n] for v, rs in results.items()}
    rows = summarise(results, np.random.default_rng(0))
    names = next((r["stage_names"] for v, rs in results.items() if v != "bare" for r in rs), {})
    print(f"\nc={args.concurrency}, {args.num_prompts} measured requests after {args.warmup} warm-up, "
          f"{args.input_len} in / {args.output_len} out, {n} rounds; stages: "
          + ", ".join(f"{k}={v}" for k, v in sorted(names.items())))
    roles = sorted({k for r in rows for k in r["cpu_ms_per_request"]})
    print("| variant | " + " | ".join(roles) + " | pipeline ms/req | events/req | added pipeline ms/req "
          "[95% CI] | added % | added µs/event | agent µs/event | py-spy µs/event | req/s | TTFP p50 ms |")
    print("|---" * (len(roles) + 10) + "|")
    for r in rows:
        print(f"| {r['variant']} | " + " | ".join(f"{r['cpu_ms_per_request'].get(k, 0):.2f}" for k in roles)
              + f" | {r['pipeline_ms']:.1f} | {r['events_per_request']:.0f} | {_fmt(r.get('pipeline_added_ms'))} | "
              f"{_fmt(r.get('pipeline_added_pct'), '%')} | {_fmt(r.get('pipeline_added_us_per_event'))} | "
              f"{_fmt(r.get('agent_us_per_event'))} | {_fmt(r.get('py-spy_us_per_event'))} | "
              f"{r['throughput']:.2f} | {r['ttfp_p50_ms']:.0f} |")
    for r in rows:
        if "pipeline_added_vs_omnitrace_pct" in r:
            print(f"{r['variant']} against omnitrace, paired by round: pipeline CPU "
                  f"{_fmt(r['pipeline_added_vs_omnitrace_pct'], '%')}, agent CPU {_fmt(r['agent_vs_omnitrace_pct'], '%')}")
        if "pipeline_vs_omnitrace_speed_adjusted_pct" in r:
            print(f"  the machine-speed probe's own difference {_fmt(r['probe_vs_omnitrace_pct'], '%')}; pipeline CPU "
                  f"with the probe's drift regressed out {_fmt(r['pipeline_vs_omnitrace_speed_adjusted_pct'], '%')}")
        if "pipeline_this_vs_tree_pct" in r:
            print(f"{r['variant'].partition('@')[0]} of this checkout against {r['variant']}, paired by round: "
                  f"pipeline CPU {_fmt(r['pipeline_this_vs_tree_pct'], '%')}")
    print_quality(results)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="bare,omnitrace", help=f"comma list of {', '.join(ALL)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--warmup", type=int, default=16)
    p.add_argument("--input-len", type=int, default=1500)
    p.add_argument("--output-len", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-rate", type=float, default=None,
                   help="an open loop at this many requests per second (default: closed loop): "
                        "below saturation the load no longer follows each variant's speed")
    p.add_argument("--serve", default="", help="server arguments (one string)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                   help="add variant omnitrace@NAME: omnitrace from the checkout at PATH")
    p.add_argument("--json", default=None, help="write every round and the summary here")
    p.add_argument("--from-json", default=None, help="summarise the rounds of an earlier --json (one stopped "
                   "early too) instead of running")
    args = p.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            doc = json.load(f)
        report(doc["rounds"], argparse.Namespace(**doc["args"]))
        return 0
    variants = args.variants.split(",")
    if not ({"bare", "omnitrace"} & set(variants)) or {v.split("@")[0].split(":")[0] for v in variants} - set(ALL):
        p.error(f"variants: a comma list of {', '.join(ALL)} including bare or omnitrace (what the rest "
                "is paired with)")
    args.trees = dict(t.split("=", 1) for t in args.tree)
    named = {v.partition("@")[2] for v in variants if "@" in v}
    if named - set(args.trees):
        p.error(f"variants name trees not given by --tree: {', '.join(sorted(named - set(args.trees)))}")
    variants += [f"omnitrace@{name}" for name in args.trees if name not in named]
    results = _run_rounds(variants, args)
    rows = report(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": results, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
