"""What does `--flame`'s clock thread cost the process it runs in? CPU-seconds from /proc,
a fresh process per trial, variants interleaved (rotating order), 95% bootstrap CIs.

Each trial process runs a fixed amount of work on its main thread (a pure-Python loop,
the GIL held as a busy stage's compute holds it) beside a poller thread (``--poll-ms`` sleeps,
an event loop's wake-ups), with one of:

* ``none``: no clock thread;
* ``base``: the clock thread of the checkout at ``--base`` (e.g. main's, before a change);
* ``new``: this checkout's clock thread, at ``--rate`` (py-spy's samples/s);
* ``idle-*``: the same clocks in a process that only sleeps for ``--idle-s``: what the
  wake-ups cost by themselves, per second.

Per trial: the process's CPU (every thread's time on a CPU, ``/proc/self/task/*/schedstat``), the
clock's switches and the threads' context switches (``/proc/self/task/*/status``). The
busy figure is CPU per unit of work against ``none`` in the same round; ``per switch`` is
the added CPU over the clock's switches.

    python benchmarks/clock_cost.py --base /work/main --rounds 12
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent('''
    import importlib.util, json, os, sys, threading, time
    variant, tree, rate, work, idle_s, poll_s = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                                 float(sys.argv[5]), float(sys.argv[6]))
    def cpu():  # ns on a CPU, every thread (none exits during the trial)
        return sum(int(open(f"/proc/self/task/{t}/schedstat").read().split()[0])
                   for t in os.listdir("/proc/self/task")) / 1e9
    def ctxt():
        n = 0
        for t in os.listdir("/proc/self/task"):
            for line in open(f"/proc/self/task/{t}/status"):
                if "ctxt_switches" in line:
                    n += int(line.split()[1])
        return n
    clock = None
    if variant.split("-")[-1] != "none":
        spec = importlib.util.spec_from_file_location("clk", os.path.join(tree, "omnitrace/profile/clock.py"))
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        try:
            clock = mod.Clock(rate=rate)
        except TypeError:  # before the schedule followed py-spy's rate
            clock = mod.Clock()
    stop = threading.Event()
    def poller():
        while not stop.is_set():
            time.sleep(poll_s)
    if poll_s > 0:
        threading.Thread(target=poller, daemon=True).start()
    if clock is not None:
        clock.start()
    time.sleep(0.05)
    c0, x0, n0, w0 = cpu(), ctxt(), len(clock.flips) if clock else 0, time.perf_counter()
    if variant.startswith("idle"):
        time.sleep(idle_s)
    else:
        s = 0
        for i in range(work):
            s += i * i % 7
    c1, x1, n1, w1 = cpu(), ctxt(), len(clock.flips) if clock else 0, time.perf_counter()
    print(json.dumps({"cpu_s": c1 - c0, "wall_s": w1 - w0, "switches": n1 - n0, "ctxt": x1 - x0}))
''')


def trial(variant: str, args: argparse.Namespace) -> dict:
    tree = args.base if variant.endswith("base") else ROOT
    out = subprocess.run([sys.executable, "-c", CHILD, variant, tree, str(args.rate), str(args.work),
                          str(args.idle_s), str(args.poll_ms / 1e3)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _ci(x: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    a = np.asarray(x, float)
    boots = a[rng.integers(0, len(a), (4000, len(a)))].mean(axis=1)
    return float(a.mean()), *map(float, np.percentile(boots, [2.5, 97.5]))


def summarise(res: dict[str, list[dict]], args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    for kind, ref in (("", "none"), ("idle-", "idle-none")):
        for v in (f"{kind}base", f"{kind}new"):
            if v not in res:
                continue
            rs, bs = res[v], res[ref]
            sw = np.median([r["switches"] / r["wall_s"] for r in rs])
            ctx = np.median([(r["ctxt"] - b["ctxt"]) / r["wall_s"] for r, b in zip(rs, bs)])
            if kind:  # CPU per second of wall time, added
                added = [(r["cpu_s"] / r["wall_s"] - b["cpu_s"] / b["wall_s"]) * 1e3 for r, b in zip(rs, bs)]
                m, lo, hi = _ci(added, rng)
                per = m / sw * 1e3 if sw else float("nan")
                print(f"{v:<10} {sw:6.1f} switches/s  +{ctx:6.1f} ctxt/s  CPU +{m:.3f} ms/s [{lo:+.3f}, {hi:+.3f}]"
                      f"  ~{per:.1f} µs per switch")
            else:  # CPU for the same work, added %
                pct = [(r["cpu_s"] / b["cpu_s"] - 1) * 100 for r, b in zip(rs, bs)]
                added_ms = [(r["cpu_s"] - b["cpu_s"]) * 1e3 for r, b in zip(rs, bs)]
                m, lo, hi = _ci(pct, rng)
                per = np.mean(added_ms) / np.median([r["switches"] for r in rs]) * 1e3
                print(f"{v:<10} {sw:6.1f} switches/s  +{ctx:6.1f} ctxt/s  CPU +{m:.2f}% [{lo:+.2f}, {hi:+.2f}]"
                      f"  ~{per:.1f} µs per switch")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default=None, help="a checkout whose clock is variant base (e.g. main)")
    p.add_argument("--rate", type=int, default=25, help="py-spy's samples/s, for the new clock's schedule")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--work", type=int, default=12_000_000, help="loop iterations of the busy thread")
    p.add_argument("--idle-s", type=float, default=2.0)
    p.add_argument("--poll-ms", type=float, default=10.0, help="the poller thread's sleeps (0: no poller)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    variants = ["none", "new", "idle-none", "idle-new"]
    if args.base:
        variants += ["base", "idle-base"]
    res: dict[str, list[dict]] = {v: [] for v in variants}
    for rnd in range(args.rounds):
        order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
        for v in order[::-1] if rnd % 2 else order:
            res[v].append(trial(v, args))
        print(f"round {rnd + 1}: " + "  ".join(f"{v} {res[v][-1]['cpu_s']:.3f}s/{res[v][-1]['switches']}"
                                              for v in variants), file=sys.stderr, flush=True)
    summarise(res, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "trials": res}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
