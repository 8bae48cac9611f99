"""Async load: warm-up then a measured batch per concurrency level, with a concurrency limit.

Request lengths follow ``vllm bench serve``'s random dataset: uniform integers in
[len * (1 - range_ratio), len * (1 + range_ratio)], drawn from one seeded generator, so the
same seed gives the same request sequence.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp

from omnitrace.bench.client import BACKENDS, DEFAULT_BACKEND, RequestResult

# A small vocabulary for synthetic prompts: one word per requested token.
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


@dataclass
class LoadSpec:
    base_url: str
    model: str = "reference"
    backend: str = DEFAULT_BACKEND  # a key of bench.client.BACKENDS
    endpoint: str = "/v1/chat/completions"
    num_prompts: int = 100
    warmup: int | None = None  # None -> concurrency
    input_len: int = 128
    output_len: int = 128
    range_ratio: float = 0.0
    seed: int = 0
    request_timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    tag: str = ""  # request id prefix, unique per bench invocation


@dataclass
class LevelResult:
    concurrency: int
    warmup_ids: list[str]
    results: list[RequestResult]
    measured_window: dict[str, int] | None
    aborted: str | None = None
    interrupted: bool = False  # cut short by Ctrl-C: the requests that finished by then


def _len(rng: random.Random, n: int, ratio: float) -> int:
    lo, hi = max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio)))
    return rng.randint(lo, hi)


def prompt_text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


async def run_level(spec: LoadSpec, concurrency: int, rng: random.Random,
                    on_done: Callable[[RequestResult], None] | None = None) -> LevelResult:
    url = spec.base_url.rstrip("/") + spec.endpoint
    n_warm = concurrency if spec.warmup is None else spec.warmup
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s, sock_connect=10)
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    backend = BACKENDS[spec.backend]

    def make(i: int, warm: bool) -> tuple[RequestResult, dict[str, Any]]:
        ilen, olen = _len(rng, spec.input_len, spec.range_ratio), _len(rng, spec.output_len, spec.range_ratio)
        rid = f"{spec.tag}c{concurrency}-{'w' if warm else 'm'}{i}"
        body = backend.body(spec.model, prompt_text(rng, ilen), ilen, olen, spec.extra_body)
        return RequestResult(rid, concurrency, warm, ilen, olen), body

    async def one(session: aiohttp.ClientSession, res: RequestResult, body: dict[str, Any]) -> RequestResult:
        try:
            async with sem:
                await backend.send(session, url, body, res)
        except asyncio.CancelledError:
            if res.start_unix_ns and on_done:  # sent, then the bench was interrupted: a row
                res.error = "cancelled: bench interrupted"
                on_done(res)
            raise
        if on_done:
            on_done(res)
        return res

    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        warm = [make(i, True) for i in range(n_warm)]
        done_warm = await asyncio.gather(*(one(session, r, b) for r, b in warm))
        if done_warm and all(r.error and r.error.startswith("connection failed") for r in done_warm):
            return LevelResult(concurrency, [r.id for r in done_warm], list(done_warm), None,
                               aborted=f"every warm-up request failed ({done_warm[0].error}); "
                                       "measured requests not sent")
        measured = [make(i, False) for i in range(spec.num_prompts)]
        start = time.time_ns()
        done = await asyncio.gather(*(one(session, r, b) for r, b in measured))
        end = time.time_ns()
    return LevelResult(concurrency, [r.id for r in done_warm], list(done_warm) + list(done),
                       {"start_unix_ns": start, "end_unix_ns": end})
