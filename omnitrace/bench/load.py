"""Async load: warm-up then a measured batch per concurrency level, with a concurrency limit.

Request lengths follow ``vllm bench serve``'s random dataset: uniform integers in
[len * (1 - range_ratio), len * (1 + range_ratio)], drawn from one seeded generator, so the
same seed gives the same request sequence.

Arrivals follow ``vllm bench serve --request-rate R --burstiness B``: with a finite rate the
measured requests are sent at gamma-distributed gaps (shape B, mean 1/R; B = 1 is a Poisson
process), still at most ``concurrency`` at a time (its ``--max-concurrency``); with the
default infinite rate every request is sent as soon as a slot is free (a closed loop). The
gaps come from their own generator of the same seed, so the prompts are the same at any
rate. An open loop below saturation keeps the offered load fixed: what one request costs
then does not move with how fast the server happens to be (a closed loop's per-second
costs spread over however many requests it managed).
"""
from __future__ import annotations

import asyncio
import functools
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp

from omnitrace.bench.client import BACKENDS, DEFAULT_BACKEND, RequestResult
from omnitrace.bench.stall import StallWatch

# A small vocabulary for synthetic prompts: one word per requested token.
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


REQUEST_TIMEOUT_S = 600.0  # a request's whole stream, by default (vLLM-Omni's longest answers)
# the load's defaults of `omnitrace bench` and of `omnitrace loadtest` (a first look at the
# reference pipeline), in one place: `bench --help` says where they differ
BENCH_DEFAULTS = {"concurrency": ["8"], "num_prompts": 100, "input_len": 128, "output_len": 128}
LOADTEST_DEFAULTS = {"concurrency": ["16"], "num_prompts": 96, "input_len": 1500, "output_len": 60}


def loadtest_differences() -> list[str]:
    """``--option VALUE`` of each load default `omnitrace loadtest` sets otherwise."""
    return [f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}"
            for k, v in LOADTEST_DEFAULTS.items() if BENCH_DEFAULTS.get(k) != v]


def concurrency_levels(values: list[str]) -> list[int]:
    """``--concurrency`` values (8 16 32 or 8,16) as levels; ValueError unless positive integers."""
    out: list[int] = []
    for v in values:
        for part in str(v).split(","):
            if part.strip():
                n = int(part)
                if n <= 0:
                    raise ValueError
                out.append(n)
    if not out:
        raise ValueError
    return out


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
    request_timeout_s: float = REQUEST_TIMEOUT_S
    request_rate: float | None = None  # measured requests per second (None: a closed loop)
    burstiness: float = 1.0
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


RATE_HELP = ("measured requests per second, sent at random gaps (Poisson at --burstiness 1), "
             "at most --concurrency at a time (default: inf, each as soon as a slot is free)")
BURSTINESS_HELP = "gamma shape of the gaps with --request-rate: < 1 burstier, > 1 more even"


def check_arrivals(request_rate: float | None, burstiness: float) -> None:
    """ValueError unless the rate (None: infinite) and burstiness can schedule arrivals."""
    if not ((request_rate is None or request_rate > 0) and 0 < burstiness < math.inf):
        raise ValueError("--request-rate and --burstiness must be positive")


def arrival_offsets(n: int, request_rate: float | None, burstiness: float, seed: int) -> list[float]:
    """Seconds from the first measured request to each one's send: vLLM's gamma gaps (shape
    ``burstiness``, mean ``1/request_rate``), the first at 0; all 0 without a rate (None or
    infinite: a closed loop)."""
    if request_rate is None or math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(f"arrivals-{seed}")  # apart from the prompts' generator
    scale = 1.0 / (request_rate * burstiness)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, scale)
    return out


def _len(rng: random.Random, n: int, ratio: float) -> int:
    lo, hi = max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio)))
    return rng.randint(lo, hi)


def prompt_text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


async def _watch(watch: StallWatch, in_flight: list[int]) -> None:
    while True:
        await asyncio.sleep(1.0)
        watch.check(in_flight[0])


async def run_level(spec: LoadSpec, concurrency: int, rng: random.Random,
                    on_done: Callable[[RequestResult], None] | None = None,
                    watch: StallWatch | None = None) -> LevelResult:
    """Warm-up, then the measured requests; ``watch`` hears of every stream chunk and
    request end, and is asked once a second whether the load stalled."""
    watch = watch or StallWatch(0, lambda _: None)
    in_flight = [0]  # requests sent and not ended
    watcher = asyncio.ensure_future(_watch(watch, in_flight))
    try:
        result = await _level(spec, concurrency, rng, on_done, watch, in_flight)
    finally:
        watcher.cancel()
    watch.check(0)  # a stall that ended since the last look is said too
    return result


async def _at(deadline: float, send: Callable[[], Awaitable[RequestResult]]) -> RequestResult:
    """``send()`` once the event loop's clock reads ``deadline`` (absolute, so the gaps do
    not drift with how late each task starts)."""
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)
    return await send()


async def _level(spec: LoadSpec, concurrency: int, rng: random.Random,
                 on_done: Callable[[RequestResult], None] | None, watch: StallWatch,
                 in_flight: list[int]) -> LevelResult:
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
                in_flight[0] += 1
                try:
                    await backend.send(session, url, body, res, progress=watch.beat)
                finally:
                    in_flight[0] -= 1
                    watch.beat()
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
        offsets = arrival_offsets(len(measured), spec.request_rate, spec.burstiness, spec.seed)
        origin = asyncio.get_running_loop().time()
        start = time.time_ns()
        done = await asyncio.gather(*(_at(origin + t, functools.partial(one, session, r, b))
                                      for t, (r, b) in zip(offsets, measured)))
        end = time.time_ns()
    return LevelResult(concurrency, [r.id for r in done_warm], list(done_warm) + list(done),
                       {"start_unix_ns": start, "end_unix_ns": end})
