"""Does omnitrace change how often a request hangs on the REAL vLLM-Omni server when the
machine is short of CPU?

    python benchmarks/vllm_starvation.py --venv .venv-vllm-032 [--rounds 6] [--burners 1]

The real-server tier saw 1-3 of 16 requests hang beside a core burner on both releases.
Here two servers of the same venv run side by side on the tiny CPU Qwen3-Omni, one bare
(``vllm serve``) and one under ``omnitrace run``, with ``--burners`` core-burning
processes beside them. They take the same load in turn, in ABBA order repeated
``--rounds`` times (``omnitrace bench``: ``--requests`` at c=``--concurrency``, each
request given ``--request-timeout`` seconds). A request that has not finished by then is
counted as hung; any other failure is counted apart. Output: per arm, windows, requests,
hung and failed, and the difference of the hang rates with a two-sided Fisher exact test
(are the two arms' hang counts what one rate would give?) and a 95% bootstrap interval
over ABBA rounds. What it found goes in docs/vllm-omni.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vllm_serve_cpu import ROOT, _env, _serve_cmd, _wait, stop_servers

ARMS = ("bare", "omnitrace")
HUNG = "timed out"  # bench's error for a request past --request-timeout (bench/client.py)


def _window(venv: Path, port: int, args: argparse.Namespace, tag: str, work: str) -> dict[str, int]:
    """One load window: requests sent, hung, failed otherwise."""
    out = os.path.join(work, f"bench-{tag}.json")
    subprocess.run([str(venv / "bin" / "omnitrace"), "bench", "--base-url", f"http://127.0.0.1:{port}",
                    "--model", "tiny-omni", "--concurrency", str(args.concurrency),
                    "--num-prompts", str(args.requests), "--warmup", "0", "--input-len", "300",
                    "--output-len", "16", "--request-timeout", str(args.request_timeout),
                    "--seed", str(abs(hash(tag)) % 10000), "--out", out],
                   env=_env(venv), capture_output=True, timeout=args.requests * args.request_timeout + 300)
    rows = [r for r in json.loads(Path(out).read_text())["requests"] if not r.get("warmup")]
    errors = [str(r.get("error") or "") for r in rows]
    return {"requests": len(rows), "hung": sum(e == HUNG for e in errors),
            "failed": sum(bool(e) and e != HUNG for e in errors)}


def fisher_two_sided(a: int, n1: int, c: int, n2: int) -> float:
    """Two-sided Fisher exact p for a of n1 vs c of n2 (sum of the tables no likelier than
    the one seen, hypergeometric); by hand: scipy is no dependency of omnitrace."""
    k, n = a + c, n1 + n2

    def p(x: int) -> float:
        return math.comb(n1, x) * math.comb(n2, k - x) / math.comb(n, k)

    seen = p(a)
    return min(1.0, sum(p(x) for x in range(max(0, k - n2), min(k, n1) + 1) if p(x) <= seen * (1 + 1e-9)))


def _start(venv: Path, port: int, run_dir: str | None) -> subprocess.Popen:
    return subprocess.Popen(_serve_cmd(venv, port, run_dir), env=_env(venv), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm-032"))
    ap.add_argument("--rounds", type=int, default=6, help="ABBA rounds (4 windows each)")
    ap.add_argument("--requests", type=int, default=16, help="requests per window")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--request-timeout", type=float, default=60.0, help="seconds before a request counts as hung")
    ap.add_argument("--burners", type=int, default=1, help="core-burning processes beside the servers")
    args = ap.parse_args()
    venv = Path(args.venv).resolve()
    work = tempfile.mkdtemp(prefix="vllm-starvation-")
    ports = {"bare": 18811, "omnitrace": 18812}
    started = time.time()
    servers = {"bare": _start(venv, ports["bare"], None),
               "omnitrace": _start(venv, ports["omnitrace"], os.path.join(work, "run"))}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    per: dict[str, list[dict[str, int]]] = {a: [] for a in ARMS}
    try:
        for a in ARMS:
            _wait(ports[a], servers[a])
        for i, a in enumerate(["bare", "omnitrace", "omnitrace", "bare"] * args.rounds):
            per[a].append(_window(venv, ports[a], args, f"{a}-{i}", work))
            print(f"window {i + 1}: {a}: {per[a][-1]}", file=sys.stderr, flush=True)
    finally:
        for b in burners:
            b.kill()
        stop_servers(list(servers.values()), started)
    _print(per, args)
    return 0


def _print(per: dict[str, list[dict[str, int]]], args: argparse.Namespace) -> None:
    tot = {a: {k: sum(w[k] for w in per[a]) for k in ("requests", "hung", "failed")} for a in ARMS}
    print(f"{args.rounds} ABBA rounds, {args.requests} requests per window at c={args.concurrency}, "
          f"{args.burners} core burner(s), a request hung after {args.request_timeout:g} s")
    print("| arm | windows | requests | hung | failed otherwise | hang rate |\n|---|---|---|---|---|---|")
    for a in ARMS:
        t = tot[a]
        print(f"| {a} | {len(per[a])} | {t['requests']} | {t['hung']} | {t['failed']} | "
              f"{100 * t['hung'] / max(t['requests'], 1):.1f}% |")
    p = fisher_two_sided(tot["omnitrace"]["hung"], tot["omnitrace"]["requests"],
                         tot["bare"]["hung"], tot["bare"]["requests"])
    # per ABBA round: (instrumented - bare) hang rate, resampled by round
    rate = {a: np.array([w["hung"] / max(w["requests"], 1) for w in per[a]]).reshape(-1, 2).mean(axis=1)
            for a in ARMS}
    d = rate["omnitrace"] - rate["bare"]
    rng = np.random.default_rng(0)
    lo, hi = np.percentile([rng.choice(d, len(d)).mean() for _ in range(4000)], [2.5, 97.5])
    print(f"hang rate omnitrace - bare: {100 * d.mean():+.1f} points [95% CI {100 * lo:+.1f}, {100 * hi:+.1f}] "
          f"over {len(d)} rounds; Fisher exact p = {p:.3f}")


if __name__ == "__main__":
    sys.exit(main())
