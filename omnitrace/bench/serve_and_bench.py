"""Start the reference pipeline, wait until it answers, run `omnitrace bench`, stop it.

Meant to run under `omnitrace run`, so the server, its stage processes and the bench
are all in one run directory::

    omnitrace run --run-dir D -- python -m omnitrace.bench.serve_and_bench \\
        --serve "--snapshot recursive --pipeline P.yaml" -- --concurrency 32 --num-prompts 64

Everything after ``--`` goes to `omnitrace bench` (``--base-url`` is filled in).
"""
from __future__ import annotations

import argparse
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from omnitrace import childproc, console
from omnitrace.childproc import python_module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> str | None:
    """None when the server answers /health, else why not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"server exited with status {proc.returncode} before answering"
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as r:
                if r.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return f"server did not answer {url}/health within {timeout_s:.0f} s"


def _bench(url: str, bench_args: list[str]) -> int:
    """`omnitrace bench` against ``url``, its exit status. A process of its own, as
    `omnitrace loadtest` runs it: this library does not import the command. A stop signal
    here is passed on (``childproc.stop_like_ctrl_c``: `omnitrace run` sends its own to this
    process alone), and the bench keeps its partial results."""
    childproc.stop_like_ctrl_c()
    bench = childproc.start(python_module("omnitrace", "bench", "--base-url", url, *bench_args))
    while True:
        try:
            return bench.wait()
        except KeyboardInterrupt:  # passed on: wait for the bench's partial results
            pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, bench_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m omnitrace.bench.serve_and_bench")
    p.add_argument("--serve", default="", help="arguments for the reference server (one string)")
    p.add_argument("--port", type=int, default=0, help="0 = a free port")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = python_module("omnitrace.cli.serve", "--port", str(port), *shlex.split(args.serve))
    server = subprocess.Popen(cmd)
    try:
        why = wait_healthy(url, server, args.startup_timeout)
        if why:
            console.say("serve_and_bench", why)
            return 1
        return _bench(url, bench_args)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


if __name__ == "__main__":
    sys.exit(main())
