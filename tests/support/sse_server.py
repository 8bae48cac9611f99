"""A stand-in OpenAI-compatible SSE server (aiohttp) for the bench client's tests."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from aiohttp import web


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(mode: str) -> tuple[int, list[dict], threading.Event]:
    port, seen, stop = _free_port(), [], threading.Event()

    async def chat(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        seen.append({"id": req.headers.get("x-request-id"), "body": body, "at_ns": time.time_ns()})
        if mode == "http500":
            return web.Response(status=500, text="boom")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        if mode == "done_only":  # a stream that ends at once: no text, no audio
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if mode == "stream_error":
            await resp.write(b'data: {"error": {"message": "stage 1 died"}}\n\n')
            return resp
        if mode == "slow":
            await asyncio.sleep(0.3)
        await resp.write(b": ping\n\n")
        await asyncio.sleep(0.01)
        await resp.write(b'data: {"modality":"text","choices":[{"delta":{"content":"hi"}}],'
                         b'"usage":{"completion_tokens":1}}\n\n')
        await asyncio.sleep(0.02)
        await resp.write(b'data: {"modality":"audio","choices":[{"delta":{"content":""}}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def run() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        while not stop.is_set():
            loop.run_until_complete(asyncio.sleep(0.05))
        loop.run_until_complete(runner.cleanup())

    threading.Thread(target=run, daemon=True).start()
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return port, seen, stop
