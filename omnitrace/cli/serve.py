"""`omnitrace serve` / `python -m omnitrace.cli.serve`: start the reference pipeline.

Stages start as spawned processes, then the HTTP server listens. SIGINT/SIGTERM stop the
server, every stage process, and sweep any shared-memory segment this server left.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from aiohttp import web

from omnitrace import record
from omnitrace.runtime import config
from omnitrace.runtime.api import Api, Pipeline
from omnitrace.runtime.shm import MODES
from omnitrace.runtime.snapshot import STRATEGIES
from omnitrace import console


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="omnitrace serve",
        description="Serve the reference omni pipeline (thinker -> talker -> code2wav by default) "
                    "with an OpenAI-compatible streaming /v1/chat/completions.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--pipeline", metavar="FILE", default=None,
                    help="pipeline config YAML (default: the packaged Qwen3-Omni shape, "
                         "examples/qwen3_omni.yaml)")
    ap.add_argument("--snapshot", choices=STRATEGIES, default="copy",
                    help="request snapshot per chunk: copy (flat list copies, the fix) or "
                         "recursive (element-by-element walk, before the fix)")
    ap.add_argument("--shm", choices=MODES, default="per-chunk",
                    help="chunk transfer: a new segment per chunk (as vLLM-Omni) or a pool of reused segments")
    return ap.parse_args(argv)


async def _serve(args: argparse.Namespace, cfg: config.PipelineConfig) -> int:
    loop = asyncio.get_running_loop()
    # the loop thread's ring now, not at the first request: the agent then knows the API's
    # ring before any stage records for that request (its arrival and trace context first)
    record.thread_ring()
    pipeline = Pipeline(cfg, args.snapshot, args.shm)
    pipeline.loop = loop
    # Stage processes inherit a blocked SIGINT (the mask survives exec), so a Ctrl-C while
    # they import cannot kill them half-started; ours stays pending until the handler is in.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    stop = asyncio.Event()
    try:
        pipeline.spawn()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    ready = asyncio.ensure_future(loop.run_in_executor(None, pipeline.wait_ready))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():  # Ctrl-C / SIGTERM while the stages were starting
        await loop.run_in_executor(None, pipeline.stop)
        await ready
        return 0
    stopped.cancel()
    try:
        ready.result()
    except RuntimeError as e:
        console.say("serve", f"error: {e}")
        return 1
    runner = web.AppRunner(Api(pipeline).app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port, shutdown_timeout=5.0)
        await site.start()
    except OSError as e:
        console.say("serve", f"error: cannot listen on {args.host}:{args.port}: "
                    f"{e.strerror or 'address already in use'} (choose another with --port)")
        await runner.cleanup()
        await loop.run_in_executor(None, pipeline.stop)
        return 1
    names = " -> ".join(s.name for s in cfg.stages)
    print(f"omnitrace serve: listening on http://{args.host}:{args.port} "
          f"(pipeline {cfg.name}: {names}; snapshot {args.snapshot}; shm {args.shm})", flush=True)
    await stop.wait()
    print("omnitrace serve: stopping", flush=True)
    await loop.run_in_executor(None, pipeline.stop)  # stream handlers get an error item first
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = config.load(args.pipeline)  # validated before any process starts
    except config.PipelineConfigError as e:
        console.say("serve", f"error: {e}")
        return 2
    record.set_process_info(role="api", stage=-1, replica=0, name="api")
    try:
        return asyncio.run(_serve(args, cfg))
    except KeyboardInterrupt:  # Ctrl-C before any stage process existed
        return 130


if __name__ == "__main__":
    sys.exit(main())
