"""Wall time, CPU and peak memory of every reader of a recorded run: `omnitrace report`,
`omnitrace export` and the flame graphs' span index (what `omnitrace flame` builds when a
run has no ``profiles/spans.npz``), each in a child process under ``/usr/bin/time``.
With ``--tree NAME=PATH`` the same commands of another checkout run alternately beside
these, on the same run (side by side in one sitting: this machine's speed drifts).

    python benchmarks/load_memory.py RUN [--tree base=/path/to/checkout] [--rounds 2]

RUN: any run directory with an event log (``benchmarks/report_events_scaling.py
--keep DIR`` makes a large synthetic one).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "report": ["-m", "omnitrace", "report", "{run}", "--json", os.devnull],
    "export": ["-m", "omnitrace", "export", "{run}", "--otlp-json", os.devnull],
    "flame index": ["-c", "import sys; from omnitrace.profile import linked; linked.build_index(sys.argv[1])", "{run}"],
}


def measure(tree: str, argv: list[str], run: str) -> dict:
    """One command of ``tree`` on ``run``: wall s, CPU s, peak RSS GB, exit code."""
    cmd = ["/usr/bin/time", "-f", "%e %U %S %M", sys.executable, *(a.format(run=run) for a in argv)]
    env = dict(os.environ, PYTHONPATH=tree)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    wall, user, sys_s, rss_kb = r.stderr.strip().splitlines()[-1].split()
    return {"wall": float(wall), "cpu": float(user) + float(sys_s), "rss_gb": int(rss_kb) / 2**20,
            "rc": r.returncode, "err": r.stderr[-500:] if r.returncode not in (0, 3) else ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--only", choices=sorted(COMMANDS), action="append")
    args = p.parse_args()
    trees = [("this", HERE)] + [tuple(t.split("=", 1)) for t in args.tree]
    rows = []
    for rnd in range(args.rounds):
        for name in args.only or COMMANDS:
            order = trees if rnd % 2 == 0 else trees[::-1]
            for tree, path in order:
                m = measure(path, COMMANDS[name], args.run)
                rows.append((name, tree, m))
                print(f"{name:12} {tree:8} exit {m['rc']}  {m['wall']:7.1f} s wall  {m['cpu']:7.1f} s CPU  "
                      f"peak RSS {m['rss_gb']:.2f} GB {m['err']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
