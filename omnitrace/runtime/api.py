"""API server: ``POST /v1/chat/completions`` (SSE, vLLM-Omni's openai-chat-omni shape),
``POST /v1/audio/speech`` (vLLM-Omni's speech route: raw audio, SSE or one body; see
``routes.py``), ``GET /health``, ``GET /v1/models``; starts, feeds, watches and stops the
stage processes.

Control traffic API <-> stages goes over multiprocessing queues (ZMQ in vLLM-Omni); the
async-chunk data path between stages is the shared-memory connector only.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import re
import threading
import time
from collections import deque
from multiprocessing.connection import wait as mp_wait
from typing import Any

import orjson
from aiohttp import web

from omnitrace import record, tracecontext
from omnitrace.conventions import REQUEST_ID_PATTERN, Ev, Status
from omnitrace.runtime import config as config_mod
from omnitrace.runtime import routes, shm
from omnitrace.runtime.stage import stage_main

_EV_ARRIVE, _EV_DISPATCH = int(Ev.REQUEST_ARRIVE), int(Ev.REQUEST_DISPATCH)
_EV_FIRST_TEXT, _EV_FIRST_AUDIO = int(Ev.REQUEST_FIRST_TEXT), int(Ev.REQUEST_FIRST_AUDIO)
_EV_END, _EV_DIED = int(Ev.REQUEST_END), int(Ev.STAGE_DIED)
_EV_PARSED, _EV_RECEIVED = int(Ev.REQUEST_PARSED), int(Ev.PACKET_RECEIVED)
_EV_RESUMED = int(Ev.PACKET_RESUMED)
_API = -1
_REQ_ID = re.compile(REQUEST_ID_PATTERN)  # it names /dev/shm segments


class Flight:
    """One request in flight: the stream's queue and which stages have finished it."""

    __slots__ = ("rid", "queue", "finished", "prompt_tokens", "max_tokens", "audio_seen", "error")

    def __init__(self, rid: str, prompt_tokens: int, max_tokens: int) -> None:
        self.rid, self.prompt_tokens, self.max_tokens = rid, prompt_tokens, max_tokens
        self.error: str | None = None  # why the request failed (a stage died, the server stopped)
        self.queue: asyncio.Queue[tuple] = asyncio.Queue()
        self.finished: set[int] = set()
        self.audio_seen = False  # first audio packet marked as received from the stage


class Pipeline:
    """The stage processes and the routing of their outputs to request streams."""

    def __init__(self, cfg: config_mod.PipelineConfig, snapshot: str = "copy",
                 shm_mode: str = "per-chunk") -> None:
        self.cfg, self.snapshot, self.shm_mode = cfg, snapshot, shm_mode
        self.n = len(cfg.stages)
        self.pool_prefix = f"ortpool{os.getpid()}"
        self.procs: list[Any] = []
        self.in_qs: list[Any] = []
        self.flights: dict[str, Flight] = {}
        self.recent: deque[str] = deque(maxlen=4096)  # ended ids, swept at stop
        self.dead: str | None = None
        self.fatal: dict[int, str] = {}
        self.stopping = False
        self.capacity = min(s.max_batch_size + s.max_waiting for s in cfg.stages)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ctx = mp.get_context("spawn")
        self.out_q = self._ctx.Queue()
        self._ready: set[int] = set()
        self._ready_evt = threading.Event()
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 120.0) -> None:
        self.spawn()
        self.wait_ready(timeout_s)

    def spawn(self) -> None:
        """Start the stage processes (serve.py blocks SIGINT around this call)."""
        pipe_dict = config_mod.to_dict(self.cfg)
        for s in self.cfg.stages:
            q = self._ctx.Queue()
            p = self._ctx.Process(
                target=stage_main, name=f"stage{s.stage_id}-{s.name}", daemon=True,
                args=(pipe_dict, s.stage_id, self.snapshot, self.shm_mode, self.pool_prefix,
                      q, self.out_q, os.getpid()))
            p.start()
            self.procs.append(p)
            self.in_qs.append(q)
        threading.Thread(target=self._reader, name="stage-outputs", daemon=True).start()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until every stage reported ready; RuntimeError naming a stage that failed."""
        deadline = time.monotonic() + timeout_s
        while not self._ready_evt.wait(0.1):
            if self.stopping:
                return
            for s, p in zip(self.cfg.stages, self.procs):
                if not p.is_alive():
                    msg = self.fatal.get(s.stage_id, f"exit code {p.exitcode}")
                    self.stop()
                    raise RuntimeError(f"stage {s.stage_id} ({s.name}) failed to start: {msg}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"stages not ready after {timeout_s:.0f} s")
        threading.Thread(target=self._watch, name="stage-watch", daemon=True).start()

    def stop(self) -> None:
        """Stop every stage (stop message, then SIGTERM, then SIGKILL) and sweep segments."""
        if self.stopping:
            return
        self.stopping = True
        for rid, fl in list(self.flights.items()):
            self._post(fl, ("error", "server shutting down"))
        for q in self.in_qs:
            try:
                q.put(("stop",))
            except (OSError, ValueError):
                pass
        self._wake_w.send(b"x")
        deadline = time.monotonic() + 5.0
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        self.sweep(list(self.flights) + list(self.recent))
        self.out_q.cancel_join_thread()
        for q in self.in_qs:
            q.cancel_join_thread()

    def stage_info(self) -> list[dict]:
        """Name, pid and liveness per stage (pids for py-spy and for tests)."""
        return [{"id": s.stage_id, "name": s.name, "pid": p.pid, "alive": p.is_alive()}
                for s, p in zip(self.cfg.stages, self.procs)]

    def sweep(self, rids: list[str]) -> list[str]:
        """Unlink leftover chunk segments of these requests and this server's pool."""
        return shm.sweep([f"{r}_" for r in rids] + [f"{self.pool_prefix}@"])

    # ------------------------------------------------------------------ requests
    def submit(self, rid: str, prompt_tokens: int, max_tokens: int) -> Flight:
        fl = Flight(rid, prompt_tokens, max_tokens)
        self.flights[rid] = fl
        msg = ("add", rid, prompt_tokens, max_tokens)
        for q in reversed(self.in_qs):  # downstream stages first: prewarmed like vLLM-Omni
            q.put(msg)
        record.emit(_EV_DISPATCH, rid, _API, -1, 0, 0)
        return fl

    def abort(self, rid: str) -> None:
        for q, p in zip(self.in_qs, self.procs):
            if p.is_alive():
                q.put(("abort", rid))

    def release(self, rid: str) -> None:
        if self.flights.pop(rid, None) is not None:
            self.recent.append(rid)

    # ------------------------------------------------------------------ threads
    def _reader(self) -> None:
        """Stage outputs -> the event loop, in batches (one wake-up per burst)."""
        while True:
            try:
                msgs = [self.out_q.get()]
                while len(msgs) < 256:
                    try:
                        msgs.append(self.out_q.get_nowait())
                    except Exception:
                        break
                # the whole burst has left the stage pipe (stamped after its last message: one
                # taken while this thread was descheduled mid-burst may have been emitted after
                # the burst's first, and its loop lag must not start before its emit)
                t_recv = time.perf_counter_ns()
            except (EOFError, OSError, ValueError):
                return
            ready = [m for m in msgs if m[0] in ("ready", "fatal")]
            for m in ready:
                if m[0] == "ready":
                    self._ready.add(m[1])
                else:
                    self.fatal[m[1]] = m[2]
            if len(self._ready) == self.n:
                self._ready_evt.set()
            if self.loop is not None and not self.loop.is_closed():
                try:
                    self.loop.call_soon_threadsafe(self._dispatch, msgs, t_recv)
                except RuntimeError:
                    return

    def _dispatch(self, msgs: list[tuple], t_recv: int = 0) -> None:
        for m in msgs:
            op = m[0]
            if op in ("text", "audio"):
                fl = self.flights.get(m[1])
                if fl is not None:
                    if op == "audio" and not fl.audio_seen:
                        # stage emit -> here: the pipe; here -> now: the event loop's lag
                        fl.audio_seen = True
                        record.emit(_EV_RECEIVED, fl.rid, _API, -1, 0, 0, t_recv)
                    fl.queue.put_nowait((op, m[3]))
            elif op == "error":
                fl = self.flights.get(m[1])
                if fl is not None:
                    fl.queue.put_nowait(("error", m[2]))
            elif op == "finish":
                fl = self.flights.get(m[1])
                if fl is not None:
                    fl.finished.add(m[2])
                    if len(fl.finished) == self.n:
                        fl.queue.put_nowait(("done",))

    def _watch(self) -> None:
        """Notice a stage process dying (its sentinel) while we are not stopping."""
        alive = {p.sentinel: (s, p) for s, p in zip(self.cfg.stages, self.procs)}
        while alive and not self.stopping:
            ready = mp_wait(list(alive) + [self._wake_r])
            if self.stopping:
                return
            for r in ready:
                if r in alive:
                    s, p = alive.pop(r)
                    p.join(0.1)
                    time.sleep(0.05)  # let a "fatal" message from the stage arrive first
                    why = self.fatal.get(s.stage_id, f"exit code {p.exitcode}")
                    text = f"stage {s.stage_id} ({s.name}) died: {why}"
                    if self.loop is not None and not self.loop.is_closed():
                        self.loop.call_soon_threadsafe(self._stage_died, s.stage_id, text)

    def _stage_died(self, sid: int, text: str) -> None:
        record.emit(_EV_DIED, "", sid, -1, 0, 0)
        if self.dead is None:
            self.dead = text
        print(f"omnitrace serve: {text}", flush=True)
        rids = list(self.flights)
        for rid in rids:
            self._post(self.flights[rid], ("error", text))
            self.abort(rid)
        # Chunks the dead stage wrote or should have read have no owner left: sweep them,
        # now and once more after the live stages have processed their aborts.
        self.sweep(rids)
        if self.loop is not None:
            self.loop.call_later(1.0, self.sweep, rids)

    def _post(self, fl: Flight, item: tuple) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fl.queue.put_nowait, item)


MAX_BODY_BYTES = 16 << 20  # a request body larger than this is refused (413)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


# --------------------------------------------------------------------------- handlers
class _Response:
    """One request's response: prepared at once for a stream, on its one write for a
    body; counts the bytes sent and stamps the first text and the first audio as they are
    handed to the socket (stamped after the write, a preempted server would put its own
    TTFP after the client had already received the packet)."""

    def __init__(self, request: web.Request, framing: routes.Framing) -> None:
        self.request, self.framing, self.rid = request, framing, framing.rid
        self.resp: web.StreamResponse | None = None
        self.sent = 0
        self.first_text = self.first_audio = False
        self.audio_framed = False  # an audio packet went into the framing, not yet sent
        self.cut_off = False

    async def open(self, length: int | None = None) -> None:
        self.resp = web.StreamResponse(headers=self.framing.headers())
        if length is not None:
            self.resp.content_length = length
        await self.resp.prepare(self.request)

    async def send(self, data: bytes, text: bool = False) -> None:
        if not data:
            return
        if self.resp is None:
            await self.open(len(data))
        mark = 0
        if text and not self.first_text:
            self.first_text, mark = True, _EV_FIRST_TEXT
        elif self.audio_framed and not self.first_audio:
            self.first_audio, mark = True, _EV_FIRST_AUDIO
        t_write = time.perf_counter_ns() if mark else 0
        assert self.resp is not None
        await self.resp.write(data)
        self.sent += len(data)
        if mark:
            record.emit(mark, self.rid, _API, -1, 0, 0, t_write)

    def cut(self) -> None:
        """No in-band error in this format: end the connection mid-body, so the client
        sees an incomplete response (as vLLM-Omni's raw audio stream does)."""
        self.cut_off = True
        transport = self.request.transport
        if transport is not None:
            transport.close()


class Api:
    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline
        self.model_name = pipeline.cfg.name
        self.write_delay_s = pipeline.cfg.api.inject_write_delay_ms / 1e3

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if self.p.dead:
            return web.json_response({"status": "error", "error": self.p.dead,
                                      "stages": self.p.stage_info()}, status=503)
        return web.json_response({"status": "ok", "pipeline": self.p.cfg.name,
                                  "stages": self.p.stage_info(), "in_flight": len(self.p.flights)})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "omnitrace"}]})

    def _parse(self, route: str, body: Any) -> routes.Ask:
        if route == "speech":
            return routes.parse_speech_request(body, self.p.cfg.limits, self.p.cfg.audio)
        return routes.parse_request(body, self.p.cfg.limits)

    async def _admit(self, request: web.Request, route: str) -> tuple[str, routes.Ask] | web.Response:
        """(request id, what it asks) of a request the server takes, or the error response
        that refuses it."""
        p = self.p
        if p.dead:
            return _error(503, p.dead, "server_error")
        if p.stopping:
            return _error(503, "server shutting down", "server_error")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return _error(400, f"body: invalid JSON ({e})")
        except web.HTTPRequestEntityTooLarge:  # as JSON, like every other error
            return _error(413, f"body: larger than {MAX_BODY_BYTES} bytes")
        try:
            ask = self._parse(route, body)
        except routes.BadRequest as e:
            return _error(400, str(e))
        rid = request.headers.get("x-request-id") or routes.default_request_id(route)
        if not _REQ_ID.match(rid):
            return _error(400, "x-request-id: must be 1-128 characters of A-Z a-z 0-9 . _ : - "
                               "starting with a letter or digit")
        if rid in p.flights:
            return _error(409, f"x-request-id: {rid!r} is already in flight")
        if len(p.flights) >= p.capacity:
            return _error(503, f"server busy: {len(p.flights)} requests in flight", "server_error")
        return rid, ask

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def speech(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "speech")

    async def _serve(self, request: web.Request, route: str) -> web.StreamResponse:
        t_arrive = time.perf_counter_ns()  # TTFP counts from here: parsing is the API's share
        admitted = await self._admit(request, route)
        if isinstance(admitted, web.Response):
            return admitted
        rid, ask = admitted
        t_parsed = time.perf_counter_ns()
        record.emit(_EV_ARRIVE, rid, _API, -1, ask.prompt_tokens, ask.max_tokens, t_arrive)
        tracecontext.record_traceparent(rid, request.headers, t_arrive)  # join the caller's trace
        record.emit(_EV_PARSED, rid, _API, -1, 0, 0, t_parsed)
        fl = self.p.submit(rid, ask.prompt_tokens, ask.max_tokens)
        framing = routes.FRAMINGS[ask.mode](rid, ask, ask.model or self.model_name, self.p.cfg.audio)
        return await self._relay(fl, _Response(request, framing))

    async def _relay(self, fl: Flight, out: _Response) -> web.StreamResponse:
        """The request's outputs to its client until done, an error or the client gone;
        its end recorded whatever happens."""
        p, rid = self.p, fl.rid
        status = int(Status.ERROR)
        try:
            if out.framing.streaming:
                await out.open()
            status = await self._pump(fl, out)
            if out.resp is None:  # one-body response that failed before its body
                return _error(500, fl.error or "server error", "server_error")
            if not out.cut_off:
                await out.resp.write_eof()
        except ConnectionResetError:
            # the client went away mid-stream: abort in every stage, one line, no traceback
            # (re-raised, aiohttp would log the whole stack as a server error)
            status = int(Status.CANCELLED)
            p.abort(rid)
            print(f"omnitrace serve: request {rid}: client disconnected after {out.sent} bytes", flush=True)
        except asyncio.CancelledError:
            # the client went away (aiohttp cancels the handler) or the server is stopping
            status = int(Status.CANCELLED)
            p.abort(rid)
            if not p.stopping:
                print(f"omnitrace serve: request {rid}: client disconnected after {out.sent} bytes",
                      flush=True)
            raise
        finally:
            if status == int(Status.ERROR) and not p.stopping and rid in p.flights and not p.dead:
                p.abort(rid)
            p.release(rid)
            record.emit(_EV_END, rid, _API, -1, status, out.sent)
        return out.resp

    async def _pump(self, fl: Flight, out: _Response) -> int:
        """Take the request's outputs from its queue and send them as framed; the status."""
        framing = out.framing
        while True:
            item = await fl.queue.get()
            op = item[0]
            if op == "text":
                await out.send(framing.text(item[1]), text=True)
            elif op == "audio":
                if not out.audio_framed:
                    record.emit(_EV_RESUMED, fl.rid, _API, -1, 0, 0)  # loop lag ends here
                    if self.write_delay_s:
                        time.sleep(self.write_delay_s)  # injected slow callback (tests)
                data = framing.audio(item[1])
                out.audio_framed = True
                await out.send(data)
            elif op == "done":
                await out.send(framing.done())
                return int(Status.OK)
            else:  # error: a stage died or the server is stopping
                fl.error = item[1]
                data = framing.error(item[1])
                if data is None:
                    if out.resp is not None:
                        out.cut()
                else:
                    await out.send(data)
                return int(Status.ERROR)
