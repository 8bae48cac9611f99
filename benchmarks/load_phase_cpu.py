"""CPU of the report's load phase by process: ``spanload.load`` into the report's sink
(``analyze.tables.ReportTables``), as ``omnitrace report`` runs it, then ``finish()``.
Prints this process's CPU (the span builder's thread and the sink's, together), the
decoding helper's, the wall time and this process's peak RSS. With ``--tree NAME=PATH``
another checkout's load runs alternately beside this one's, each in a child process.

    python benchmarks/load_phase_cpu.py RUN [--tree base=/path/to/checkout] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_once(run: str) -> None:
    import resource
    import time

    from omnitrace import spanload
    from omnitrace.analyze import tables

    def cpu(who: int) -> float:
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    t0, c0 = time.perf_counter(), cpu(resource.RUSAGE_SELF)
    acc = tables.ReportTables(frozenset())
    built = spanload.load(run, [acc])
    acc.finish(spanload.replica_of(built.log.rings))
    print(f"main {cpu(resource.RUSAGE_SELF) - c0:.2f} s  helper {cpu(resource.RUSAGE_CHILDREN):.2f} s  "
          f"wall {time.perf_counter() - t0:.2f} s  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of another checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.once:
        return load_once(args.run)
    trees = [("this", HERE)] + [tuple(t.split("=", 1)) for t in args.tree]
    for r in range(args.rounds):
        for name, path in trees:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), args.run, "--once"],
                                 env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True)
            print(f"round {r + 1} {name:8s} {out.stdout.strip() or out.stderr.strip()[-300:]}", flush=True)


if __name__ == "__main__":
    main()
