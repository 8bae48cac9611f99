"""API server: ``POST /v1/chat/completions`` (SSE, vLLM-Omni's openai-chat-omni shape),
``GET /health``, ``GET /v1/models``; starts, feeds, watches and stops the stage processes.

Control traffic API <-> stages goes over multiprocessing queues (ZMQ in vLLM-Omni); the
async-chunk data path between stages is the shared-memory connector only.
"""
from __future__ import annotations

import asyncio
import base64
import multiprocessing as mp
import os
import re
import threading
import time
import uuid
from collections import deque
from multiprocessing.connection import wait as mp_wait
from typing import Any

import orjson
from aiohttp import web

from omnitrace import record, tracecontext
from omnitrace.conventions import REQUEST_ID_PATTERN, Ev, Status
from omnitrace.runtime import config as config_mod
from omnitrace.runtime import shm
from omnitrace.runtime.stage import stage_main

_EV_ARRIVE, _EV_DISPATCH = int(Ev.REQUEST_ARRIVE), int(Ev.REQUEST_DISPATCH)
_EV_FIRST_TEXT, _EV_FIRST_AUDIO = int(Ev.REQUEST_FIRST_TEXT), int(Ev.REQUEST_FIRST_AUDIO)
_EV_END, _EV_DIED = int(Ev.REQUEST_END), int(Ev.STAGE_DIED)
_EV_PARSED, _EV_RECEIVED = int(Ev.REQUEST_PARSED), int(Ev.PACKET_RECEIVED)
_EV_RESUMED = int(Ev.PACKET_RESUMED)
_API = -1
_REQ_ID = re.compile(REQUEST_ID_PATTERN)  # it names /dev/shm segments
PROMPT_TOKENS_FIELDS = ("omnitrace_prompt_tokens", "prompt_tokens")
DEFAULT_MAX_TOKENS = 64


class BadRequest(ValueError):
    pass


class Flight:
    """One request in flight: the stream's queue and which stages have finished it."""

    __slots__ = ("rid", "queue", "finished", "prompt_tokens", "max_tokens", "audio_seen")

    def __init__(self, rid: str, prompt_tokens: int, max_tokens: int) -> None:
        self.rid, self.prompt_tokens, self.max_tokens = rid, prompt_tokens, max_tokens
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


# --------------------------------------------------------------------------- validation
def _int_field(body: dict, key: str, lo: int, hi: int, limit_name: str) -> int:
    v = body[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{key}: must be an integer, got {type(v).__name__}")
    if v < lo:
        raise BadRequest(f"{key}: must be at least {lo}, got {v}")
    if v > hi:
        raise BadRequest(f"{key}: must be at most {hi} ({limit_name}), got {v}")
    return v


def parse_request(body: Any, limits: config_mod.Limits) -> tuple[int, int, str]:
    """(prompt tokens, max_tokens, model) of a chat request, or BadRequest with a message."""
    if not isinstance(body, dict):
        raise BadRequest(f"body: must be a JSON object, got {type(body).__name__}")
    if body.get("stream") is not True:
        raise BadRequest("stream: only stream=true is supported")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: must be a non-empty list")
    words = 0
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]: must be an object")
        content = m.get("content")
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise BadRequest(f"messages[{i}].content[{j}]: must be {{\"type\": \"text\", \"text\": string}}")
                words += len(part["text"].split())
        else:
            raise BadRequest(f"messages[{i}].content: must be a string or a list of text parts")
    key = next((k for k in PROMPT_TOKENS_FIELDS if k in body), None)
    if key is not None:
        prompt = _int_field(body, key, 1, limits.max_prompt_tokens, "limits.max_prompt_tokens")
    else:
        prompt = max(1, words)
        if prompt > limits.max_prompt_tokens:
            raise BadRequest(f"prompt: {prompt} tokens is over the limit of "
                             f"{limits.max_prompt_tokens} (limits.max_prompt_tokens)")
    mt_key = "max_tokens" if "max_tokens" in body else (
        "max_completion_tokens" if "max_completion_tokens" in body else None)
    max_tokens = DEFAULT_MAX_TOKENS if mt_key is None else _int_field(
        body, mt_key, 1, limits.max_tokens, "limits.max_tokens")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise BadRequest(f"model: must be a string, got {type(model).__name__}")
    mods = body.get("modalities")
    if mods is not None and (not isinstance(mods, list) or not all(x in ("text", "audio") for x in mods)):
        raise BadRequest("modalities: must be a list of \"text\" and/or \"audio\"")
    return prompt, max_tokens, model


MAX_BODY_BYTES = 16 << 20  # a request body larger than this is refused (413)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


# --------------------------------------------------------------------------- handlers
class Api:
    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline
        self.model_name = pipeline.cfg.name
        self.write_delay_s = pipeline.cfg.api.inject_write_delay_ms / 1e3

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self.chat)
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

    async def _admit(self, request: web.Request) -> tuple[str, int, int, str | None] | web.Response:
        """(request id, prompt tokens, max tokens, model) of a request the server takes,
        or the error response that refuses it."""
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
            prompt, max_tokens, model = parse_request(body, p.cfg.limits)
        except BadRequest as e:
            return _error(400, str(e))
        rid = request.headers.get("x-request-id") or f"chatcmpl-{uuid.uuid4().hex}"
        if not _REQ_ID.match(rid):
            return _error(400, "x-request-id: must be 1-128 characters of A-Z a-z 0-9 . _ : - "
                               "starting with a letter or digit")
        if rid in p.flights:
            return _error(409, f"x-request-id: {rid!r} is already in flight")
        if len(p.flights) >= p.capacity:
            return _error(503, f"server busy: {len(p.flights)} requests in flight", "server_error")
        return rid, prompt, max_tokens, model

    async def chat(self, request: web.Request) -> web.StreamResponse:
        t_arrive = time.perf_counter_ns()  # TTFP counts from here: parsing is the API's share
        p = self.p
        admitted = await self._admit(request)
        if isinstance(admitted, web.Response):
            return admitted
        rid, prompt, max_tokens, model = admitted
        t_parsed = time.perf_counter_ns()
        record.emit(_EV_ARRIVE, rid, _API, -1, prompt, max_tokens, t_arrive)
        tracecontext.record_traceparent(rid, request.headers, t_arrive)  # join the caller's trace
        record.emit(_EV_PARSED, rid, _API, -1, 0, 0, t_parsed)
        fl = p.submit(rid, prompt, max_tokens)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", "x-request-id": rid})
        status, sent, n_text, first_audio = int(Status.ERROR), 0, 0, False
        created = int(time.time())
        model = model or self.model_name

        def chunk(modality: str, content: str, finish: str | None = None) -> bytes:
            return b"data: " + orjson.dumps({
                "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "modality": modality,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": content},
                             "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": n_text,
                          "total_tokens": prompt + n_text}}) + b"\n\n"
        try:
            await resp.prepare(request)
            while True:
                item = await fl.queue.get()
                op = item[0]
                # first text / first audio are stamped as the packet is handed to the
                # socket: stamped after the write, a preempted server put its own TTFP
                # after the client had already received the packet
                if op == "text":
                    n_text += 1
                    data = chunk("text", item[1])
                    t_write = time.perf_counter_ns() if n_text == 1 else 0
                    await resp.write(data)
                    sent += len(data)
                    if t_write:
                        record.emit(_EV_FIRST_TEXT, rid, _API, -1, 0, 0, t_write)
                elif op == "audio":
                    if not first_audio:
                        record.emit(_EV_RESUMED, rid, _API, -1, 0, 0)  # loop lag ends here
                        if self.write_delay_s:
                            time.sleep(self.write_delay_s)  # injected slow callback (tests)
                    data = chunk("audio", base64.b64encode(item[1]).decode())
                    t_write = 0 if first_audio else time.perf_counter_ns()
                    await resp.write(data)
                    sent += len(data)
                    if t_write:
                        first_audio = True
                        record.emit(_EV_FIRST_AUDIO, rid, _API, -1, 0, 0, t_write)
                elif op == "done":
                    data = chunk("text", "", "length") + b"data: [DONE]\n\n"
                    await resp.write(data)
                    sent += len(data)
                    status = int(Status.OK)
                    break
                else:  # error: a stage died or the server is stopping
                    data = b"data: " + orjson.dumps({"error": {
                        "message": item[1], "type": "server_error", "code": 500}}) + b"\n\n"
                    data += b"data: [DONE]\n\n"
                    await resp.write(data)
                    sent += len(data)
                    break
            await resp.write_eof()
        except ConnectionResetError:
            # the client went away mid-stream: abort in every stage, one line, no traceback
            # (re-raised, aiohttp would log the whole stack as a server error)
            status = int(Status.CANCELLED)
            p.abort(rid)
            print(f"omnitrace serve: request {rid}: client disconnected after {sent} bytes", flush=True)
            return resp
        except asyncio.CancelledError:
            # the client went away (aiohttp cancels the handler) or the server is stopping
            status = int(Status.CANCELLED)
            p.abort(rid)
            if not p.stopping:
                print(f"omnitrace serve: request {rid}: client disconnected after {sent} bytes",
                      flush=True)
            raise
        finally:
            if status == int(Status.ERROR) and not p.stopping and rid in p.flights and not p.dead:
                p.abort(rid)
            p.release(rid)
            record.emit(_EV_END, rid, _API, -1, status, sent)
        return resp
