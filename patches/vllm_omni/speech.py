"""Hooks for vLLM-Omni's speech route, ``POST /v1/audio/speech`` (``OmniOpenAIServingSpeech``).

The same API events as the chat route, where the meaning is the same:

* REQUEST_ARRIVE      stamped when ``create_speech`` is entered, written once the route
                      names the request (b = ``max_new_tokens``); with it the caller's
                      W3C ``traceparent`` (``omnitrace.tracecontext``)
* PACKET_RESUMED      the route took the request's first audio output from the engine
                      (the generator ``_prepare_speech_generation`` returns, wrapped)
* REQUEST_FIRST_AUDIO the first audio bytes handed to the framework: the first non-empty
                      chunk of a raw stream (``stream_format: audio``; for ``wav`` that is
                      the streaming header, sent just before the first samples), the first
                      ``speech.audio.delta`` event of an SSE stream, the whole body of a
                      non-streaming response
* REQUEST_END         a = status (an SSE ``speech.audio.error`` event, an exception, an
                      error response: ERROR; the client gone: CANCELLED), b = bytes sent
REQUEST_DISPATCH, PACKET_RECEIVED and the stage events come from the hooks the routes
share (``wrappers.server_hooks``, ``chunk_hooks``); there is no FIRST_TEXT (no text).

Request identity. The speech route names every request ``speech-<random uuid>`` and
ignores ``X-Request-Id``, so nothing the client knows reaches the engine. Under omnitrace
the route's own id call (``serving_speech.random_uuid``, the first one in
``create_speech``) returns the client's ``X-Request-Id`` instead, where it is a valid id
(1-128 of ``A-Za-z0-9._:-``, ``conventions.REQUEST_ID_PATTERN``: it ends up in shared-memory
segment names) not already in flight: the request is then ``speech-<X-Request-Id>``, the
naming the chat route uses (``chatcmpl-<X-Request-Id>``), in the route, the engine and every
stage, so its events join the client's records. The audio is byte for byte the same
(tests/system/vllm/test_vllm_speech_hooks.py). Without a usable header the uuid stays, and
the request is recorded under it.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import re
import time
from typing import Any, Callable

from omnitrace import conventions as cv
from omnitrace import record, tracecontext
from omnitrace.inject.patching import Hook, hook_failed
from omnitrace.patches.vllm_omni.wrappers import _api_process, _raw_request, _stamp_resumed
from omnitrace.requestids import route_request_id

E = cv.Ev
API = cv.API_STAGE
NO_CHUNK = cv.NO_CHUNK
_now = time.perf_counter_ns
_emit = record.emit

SPEECH_MODULE = "vllm_omni.entrypoints.openai.serving_speech"
SPEECH = "OmniOpenAIServingSpeech"
_VALID_ID = re.compile(cv.REQUEST_ID_PATTERN)
_SSE_DELTA = "event: speech.audio.delta"
_SSE_ERROR = "event: speech.audio.error"


class _Speech:
    """One speech request as the hooks follow it through the route."""

    __slots__ = ("t0", "client_id", "request", "raw", "rid", "adopted", "ended")

    def __init__(self, t0: int, client_id: str | None, request: Any, raw: Any) -> None:
        self.t0, self.client_id, self.request, self.raw = t0, client_id, request, raw
        self.rid: str | None = None  # recorded id, once the route named the request
        self.adopted = False  # the route took the client's id (in _in_flight until the end)
        self.ended = False

    def named(self, value: str) -> None:
        """The route named the request ``speech-<value>``: it has arrived."""
        self.rid = route_request_id(f"speech-{value}")
        _api_process()
        max_tokens = getattr(self.request, "max_new_tokens", None) or 0
        _emit(E.REQUEST_ARRIVE, self.rid, API, NO_CHUNK, 0, int(max_tokens), self.t0)
        headers = getattr(self.raw, "headers", None)
        if headers is not None:  # the caller's W3C trace context, if it sent one
            tracecontext.record_traceparent(self.rid, headers, self.t0)

    def end(self, status: cv.Status, sent: int = 0) -> None:
        if self.ended:
            return
        self.ended = True
        if self.adopted:
            _in_flight.discard(self.client_id)
        if self.rid is not None:
            _emit(E.REQUEST_END, self.rid, API, NO_CHUNK, int(status), sent)


_current: contextvars.ContextVar[_Speech | None] = contextvars.ContextVar("omnitrace_speech", default=None)
_in_flight: set[str] = set()  # client ids adopted and not ended (one event loop: no lock)


def _client_id(raw: Any) -> str | None:
    """The caller's ``X-Request-Id`` if it may name a request."""
    headers = getattr(raw, "headers", None)
    value = headers.get("x-request-id") if headers is not None else None
    return value if value and _VALID_ID.match(value) else None


def wrap_random_uuid(orig: Callable[[], str]) -> Callable[[], str]:
    """``serving_speech.random_uuid``: the first call inside a traced ``create_speech``
    names the request (the client's id where it has a usable one)."""

    @functools.wraps(orig)
    def random_uuid() -> str:
        st = _current.get()
        if st is None or st.rid is not None:
            return orig()
        st.adopted = st.client_id is not None and st.client_id not in _in_flight
        value = st.client_id if st.adopted else orig()  # a second request under one id keeps its uuid
        try:
            if st.adopted:
                _in_flight.add(value)
            st.named(value)
        except Exception as exc:
            hook_failed("speech arrival", exc)
        return value

    return random_uuid


def wrap_prepare(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``_prepare_speech_generation`` -> (request id, engine generator, params): the
    generator wrapped to stamp the first audio output the route takes."""

    @functools.wraps(orig)
    async def _prepare_speech_generation(self: Any, *args: Any, **kwargs: Any) -> Any:
        res = await orig(self, *args, **kwargs)
        st = _current.get()
        if st is None or st.rid is None:
            return res
        try:
            request_id, generator, *rest = res
            return (request_id, _stamp_resumed(generator, st.rid), *rest)
        except Exception as exc:
            hook_failed("speech resumed", exc)
            return res

    return _prepare_speech_generation


def wrap_create_speech(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def create_speech(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        raw = _raw_request(args, kwargs)
        st = _Speech(_now(), _client_id(raw), request, raw)
        token = _current.set(st)
        try:
            res = await orig(self, request, *args, **kwargs)
        except asyncio.CancelledError:
            st.end(cv.Status.CANCELLED)
            raise
        except BaseException:
            st.end(cv.Status.ERROR)
            raise
        finally:
            _current.reset(token)
        try:
            _respond(st, res)
        except Exception as exc:
            hook_failed("speech response", exc)
        return res

    return create_speech


def _respond(st: _Speech, res: Any) -> None:
    """What ``create_speech`` returned: a stream to watch, a body, or an error."""
    if st.rid is None:  # refused before the route named it: never arrived
        return
    status = getattr(res, "status_code", 200)
    if getattr(res, "body_iterator", None) is not None and status == 200:
        sse = str(getattr(res, "media_type", "")).startswith("text/event-stream")
        res.body_iterator = _watch_body(res.body_iterator, st, sse)
    elif status == 200 and getattr(res, "error", None) is None:
        body = getattr(res, "body", b"") or b""
        if body:
            _emit(E.REQUEST_FIRST_AUDIO, st.rid, API, NO_CHUNK, 0, 0)
        st.end(cv.Status.OK, len(body))
    else:  # an ErrorResponse or an error status; a swallowed cancellation is the client gone
        task = asyncio.current_task()
        st.end(cv.Status.CANCELLED if task is not None and task.cancelling() else cv.Status.ERROR)


def _carries_audio(item: Any, sse: bool) -> bool:
    if not item:
        return False
    if not sse:
        return True
    text = item if isinstance(item, str) else bytes(item).decode("utf-8", "replace")
    return text.startswith(_SSE_DELTA)


def _is_error_event(item: Any) -> bool:
    text = item if isinstance(item, str) else bytes(item)[:32].decode("utf-8", "replace")
    return text.startswith(_SSE_ERROR)


async def _watch_body(body: Any, st: _Speech, sse: bool) -> Any:
    """Re-yield the response body; stamp its first audio and its end. Closing this
    generator closes the route's (so the engine request is aborted as without it)."""
    first = False
    sent = 0
    status = cv.Status.OK
    try:
        async for item in body:
            if not first and _carries_audio(item, sse):
                first = True
                _emit(E.REQUEST_FIRST_AUDIO, st.rid, API, NO_CHUNK, 0, 0)
            if sse and item and _is_error_event(item):
                status = cv.Status.ERROR
            sent += len(item)
            yield item
    except (GeneratorExit, asyncio.CancelledError):  # closed, or cancelled: the client is gone
        status = cv.Status.CANCELLED
        raise
    except BaseException:
        status = cv.Status.ERROR
        raise
    finally:
        st.end(status, sent)
        if status == cv.Status.CANCELLED:
            await body.aclose()


def speech_hooks() -> list[Hook]:
    return [
        Hook("speech arrival", SPEECH_MODULE, f"{SPEECH}.create_speech", wrap_create_speech),
        Hook("speech request id", SPEECH_MODULE, "random_uuid", wrap_random_uuid),
        Hook("speech resumed", SPEECH_MODULE, f"{SPEECH}._prepare_speech_generation", wrap_prepare),
    ]
