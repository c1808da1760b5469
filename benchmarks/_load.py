"""Streaming load generator and its statistics, for benchmarks/serve.py and peers.py.

One concurrency level: C workers share a request counter and each sends
streaming requests (chat or completions) until N requests are done. Request i
uses `PROMPTS[i % len(PROMPTS)]`, so every server and every level sees the same
prompts in the same order. Each request is read as SSE with aiohttp and
reduced to a `RequestRecord`; a level's records reduce to `LevelStats`.

Definitions (all times in seconds, from `time.perf_counter`):
- TTFT: send -> first chunk with non-empty content (chat) or text (completions).
- Tokens of a request: the last `usage.completion_tokens` seen; without usage,
  the number of content chunks.
- Tokens per chunk: exact when chunks carry cumulative usage
  (`continuous_usage_stats`); otherwise the request's tokens are apportioned
  over its content chunks by character count, at least one token per chunk.
- ITL (as vLLM bench serve does for multi-token chunks): for every content
  chunk after the first, gap since the previous content chunk divided by the
  tokens in the later chunk; that value counts once per token of the chunk,
  so ITL percentiles are over tokens, not chunks.
- Output tokens/s: tokens of the successful requests / the level's wall time;
  request throughput: successful requests / wall time.

Bounds: a level sends exactly N requests; each request has a total timeout and
a cap on SSE lines; nothing here retries.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

try:  # optional: faster parsing keeps the client's share of the CPU small
    from orjson import loads as json_loads
except ImportError:  # pragma: no cover - orjson is installed with sluice
    from json import loads as json_loads

# Varied, short chat prompts: prefill stays cheap so the benchmark measures decode.
PROMPTS: tuple[str, ...] = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List three facts about the Moon.",
    "What is the capital of France and why is it famous?",
    "Describe the water cycle to a child.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Summarise the plot of Hamlet.",
    "Write a haiku about autumn rain.",
    "How do vaccines train the immune system?",
    "Translate 'good morning, friends' into Spanish and French.",
    "What are the rules of chess for a pawn?",
    "Suggest five names for a small bakery.",
    "Explain recursion with a simple example.",
    "Why do cats purr?",
    "Describe a busy train station at rush hour.",
    "What is the difference between weather and climate?",
    "Write a polite email asking for a meeting next week.",
    "How does a refrigerator keep food cold?",
    "Give three tips for learning a new language.",
    "What causes the seasons on Earth?",
    "Write a limerick about a forgetful robot.",
    "Explain what a prime number is.",
    "Describe the taste of a ripe mango.",
)


@dataclass(slots=True, frozen=True)
class LoadSpec:
    """What every request of a run looks like; the same for every server."""

    base_url: str  # e.g. "http://127.0.0.1:8000", no trailing slash
    model: str
    api: str  # "chat" or "completions"
    max_tokens: int
    ignore_eos: bool
    continuous_usage: bool  # ask for usage on every chunk (exact tokens per chunk)
    request_timeout_s: float


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it."""

    prompt_index: int
    ttft_s: float | None = None  # None when no content ever arrived
    chunk_arrivals_s: list[float] = field(default_factory=list)  # per content chunk, since send
    chunk_num_chars: list[int] = field(default_factory=list)  # per content chunk
    # Per content chunk, exact (continuous usage) or estimated (see apportion_tokens).
    chunk_num_tokens: list[int] = field(default_factory=list)
    num_output_tokens: int = 0
    e2e_s: float = 0.0
    error: str | None = None


@dataclass(slots=True)
class LevelRun:
    """The raw outcome of one level: every request, and the level's wall time."""

    records: list[RequestRecord]  # ordered by prompt_index
    wall_s: float


@dataclass(slots=True, frozen=True)
class LevelStats:
    """One server at one concurrency level; times in seconds, None when no sample."""

    concurrency: int
    num_requests: int
    num_errors: int
    wall_s: float
    num_output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    first_error: str | None


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def request_body(spec: LoadSpec, prompt: str) -> dict:
    stream_options = {"include_usage": True}
    if spec.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body = {
        "model": spec.model,
        "stream": True,
        "stream_options": stream_options,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def chunk_text(chunk: dict, api: str) -> str:
    """The visible text of choice 0 in one chunk ("" for role, finish, usage chunks)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if api == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def apportion_tokens(num_tokens: int, chunk_num_chars: list[int]) -> list[int]:
    """Spread a request's tokens over its chunks by characters, >= 1 each, summing to
    max(num_tokens, len(chunks)) (largest remainder)."""
    spare = num_tokens - len(chunk_num_chars)
    total_chars = sum(chunk_num_chars)
    if spare <= 0 or total_chars == 0:
        return [1] * len(chunk_num_chars)
    shares = [spare * n / total_chars for n in chunk_num_chars]
    extra = [math.floor(s) for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: extra[i] - shares[i])
    for i in by_remainder[: spare - sum(extra)]:
        extra[i] += 1
    return [1 + e for e in extra]


class _StreamReader:
    """Folds parsed SSE chunks into a RequestRecord (one instance per request)."""

    def __init__(self, record: RequestRecord, api: str, start_s: float) -> None:
        self.record, self.api, self.start_s = record, api, start_s
        self.usage_tokens: int | None = None  # last completion_tokens seen
        self.exact_tokens: list[int | None] = []  # per content chunk, from cumulative usage

    def on_chunk(self, chunk: dict, now_s: float) -> None:
        if "error" in chunk:
            self.record.error = f"error event: {json.dumps(chunk['error'])[:200]}"
            return
        previous = self.usage_tokens
        usage = chunk.get("usage") or {}
        if usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        text = chunk_text(chunk, self.api)
        if not text:
            return
        if self.record.ttft_s is None:
            self.record.ttft_s = now_s - self.start_s
        self.record.chunk_arrivals_s.append(now_s - self.start_s)
        self.record.chunk_num_chars.append(len(text))
        is_exact = usage.get("completion_tokens") is not None
        self.exact_tokens.append(self.usage_tokens - (previous or 0) if is_exact else None)

    def finish(self, end_s: float) -> None:
        record = self.record
        record.e2e_s = end_s - self.start_s
        num_chunks = len(record.chunk_arrivals_s)
        record.num_output_tokens = num_chunks if self.usage_tokens is None else self.usage_tokens
        if self.exact_tokens and all(t is not None and t > 0 for t in self.exact_tokens):
            record.chunk_num_tokens = [int(t) for t in self.exact_tokens]
        else:
            record.chunk_num_tokens = apportion_tokens(
                record.num_output_tokens, record.chunk_num_chars
            )


async def _read_sse(
    response: aiohttp.ClientResponse, reader: _StreamReader, max_lines: int
) -> None:
    for _ in range(max_lines):
        raw = await response.content.readline()
        if not raw:
            return  # body ended (some servers send no [DONE])
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data:"):
            continue  # blank separators, comments, event: lines
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        reader.on_chunk(json_loads(payload), time.perf_counter())
        if reader.record.error:
            return
    reader.record.error = f"more than {max_lines} SSE lines"


async def send_request(
    session: aiohttp.ClientSession, spec: LoadSpec, prompt_index: int, prompt: str | None = None
) -> RequestRecord:
    """One streaming request, start to [DONE]; never raises, failures land in .error.

    The prompt is `PROMPTS[prompt_index % len(PROMPTS)]` unless `prompt` is given."""
    record = RequestRecord(prompt_index=prompt_index)
    path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
    body = request_body(spec, PROMPTS[prompt_index % len(PROMPTS)] if prompt is None else prompt)
    start_s = time.perf_counter()
    reader = _StreamReader(record, spec.api, start_s)
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    url = spec.base_url + path
    if await _post(session, url, body, timeout, spec, record, reader):
        # A pooled connection the server had closed (llama-server closes each
        # after its stream while announcing keep-alive): the request never
        # reached it. Once more on a new connection of its own, as
        # openai-python's httpx does; the time already spent stays in the record.
        record.error = None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            await _post(fresh, url, body, timeout, spec, record, reader)
    reader.finish(time.perf_counter())
    return record


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    timeout: aiohttp.ClientTimeout,
    spec: LoadSpec,
    record: RequestRecord,
    reader: _StreamReader,
) -> bool:
    """One POST read to its end into `record`; True when the connection
    failed before any answer (the request may be sent again)."""
    answered = False
    try:
        async with session.post(url, json=body, timeout=timeout) as response:
            answered = True
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
            else:
                # Several lines per token at most (data + blank), plus role/usage/[DONE].
                await _read_sse(response, reader, max_lines=4 * spec.max_tokens + 64)
    except (TimeoutError, aiohttp.ClientError, ValueError, UnicodeDecodeError) as error:
        record.error = f"{type(error).__name__}: {error}"[:200]
        is_dead_connection = isinstance(
            error, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)
        )
        return is_dead_connection and not answered
    return False


async def run_level(
    session: aiohttp.ClientSession,
    spec: LoadSpec,
    concurrency: int,
    num_requests: int,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> LevelRun:
    """Send num_requests requests with `concurrency` workers; `on_record` sees each as it ends."""
    next_index = 0
    records: list[RequestRecord] = []

    async def worker() -> None:
        nonlocal next_index
        while next_index < num_requests:  # bounded: each pass consumes one index
            index, next_index = next_index, next_index + 1
            records.append(await send_request(session, spec, index))
            if on_record is not None:
                on_record(records[-1])

    start_s = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall_s = time.perf_counter() - start_s
    return LevelRun(sorted(records, key=lambda r: r.prompt_index), wall_s)


def inter_token_latencies(record: RequestRecord) -> list[float]:
    """Per-token ITL samples of one request (see the module docstring)."""
    samples: list[float] = []
    arrivals, tokens = record.chunk_arrivals_s, record.chunk_num_tokens
    for i in range(1, len(arrivals)):
        gap_s = arrivals[i] - arrivals[i - 1]
        samples.extend([gap_s / tokens[i]] * tokens[i])
    return samples


def level_stats(concurrency: int, run: LevelRun) -> LevelStats:
    records, wall_s = run.records, run.wall_s
    ok = [r for r in records if r.error is None]
    errors = [r.error for r in records if r.error is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [s for r in ok for s in inter_token_latencies(r)]
    num_tokens = sum(r.num_output_tokens for r in ok)
    wall_s = max(wall_s, 1e-9)
    return LevelStats(
        concurrency=concurrency,
        num_requests=len(records),
        num_errors=len(errors),
        wall_s=wall_s,
        num_output_tokens=num_tokens,
        output_tokens_per_s=num_tokens / wall_s,
        requests_per_s=len(ok) / wall_s,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        itl_p50_s=percentile(itls, 50),
        itl_p99_s=percentile(itls, 99),
        e2e_p50_s=percentile([r.e2e_s for r in ok], 50),
        first_error=errors[0] if errors else None,
    )
