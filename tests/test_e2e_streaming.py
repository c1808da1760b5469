"""The original failure, end to end: lagging streams on the real engine, over real sockets.

The real server (engine in its own process, the embedded model) serves 32
greedy streaming completions with logprobs and continuous usage stats while
the event loop is stalled periodically by a test-owned task, half the clients read
slowly through a tiny TCP receive window, in bursts (so the server's transport
really pauses: its `sluice:stream_write_waits` counter must move), and bursts
of ~2,000-token prompts keep arriving. Every chunk of
every stream is checked against the streaming contract
(`sluice.testing.contract`) and against the non-streamed response of the same
request: each token delivered exactly once, usage equal to the tokens
delivered on every chunk, one logprob entry per token, the same text.

The references are fetched first, with no stall and no load, so a fault in
how deltas merge under lag cannot hide by corrupting both sides alike. Their
duration also measures a decode step of this batch on this machine; each
stall then lasts a few such steps, so several steps' deltas pile up in the
slots (surely in the decode steps between bursts, where steps are
shortest) however fast or loaded the machine is: coalescing must be seen.

Sizes are for a loaded 2-core CPU (a 32-request decode step takes 0.3-3 s,
a step with a 256-token prefill chunk 1-10 s): the scenario's shape, smaller
numbers. A burst of long prompts prefills for ~18 steps, then rests as long
as it took, so the 24-token streams see both prefill steps and decode steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import aiohttp
import pytest

from sluice.config import CacheConfig, EngineConfig, SchedulerConfig
from sluice.server.http.launch import build_engine
from sluice.testing.contract import Expectations, check_stream, parse_sse, read_body
from sluice.testing.live_server import LiveServer
from sluice.testing.loop_stall import LoopStaller
from sluice.testing.slow_socket import read_slowly

pytestmark = pytest.mark.slow

NUM_STREAMS = 32
MAX_TOKENS = 24
# Many alternatives make big chunks: a slow reader's connection fills up.
TOP_LOGPROBS = 20
# Long prompts arrive this many at a time, burst after burst, until the streams end.
NUM_CONCURRENT_LONG_PROMPTS = 2
LONG_PROMPT_TOKENS = 2000
# Slow readers read this many times slower than a stream produces, paced by
# the decode step measured in the run (a loaded machine decodes slower: a fixed
# pace would keep up with it and nothing would ever wait); their receive window
# and the server's buffers per connection are tiny.
SLOW_READ_SLOWDOWN = 3.0
SLOW_READ_PAUSE_RANGE_S = (0.1, 0.5)
SLOW_READ_MIN_BYTES = 32
# Draining a full buffer at that pace may take tens of seconds on a loaded
# machine: the send timeout (tested elsewhere) must not cut these streams.
SEND_TIMEOUT_S = 600.0
RECEIVE_BUFFER_BYTES = 1024
SEND_BUFFER_BYTES = 4096
# Under load the loop is blocked for a few decode steps, every second.
LOOP_STALL_EVERY_S = 1.0
LOOP_STALL_IN_DECODE_STEPS = 2.5
LOOP_STALL_FOR_S_RANGE = (1.2, 8.0)
# Streamed and reference runs batch differently: same tokens, logprobs equal
# up to float32 reduction order.
LOGPROB_ATOL = 1e-3
TEST_TIMEOUT_S = 900
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=300)

OPENINGS = ("Here is a short poem about", "Once upon a time, there was",
            "A child asked me what makes", "Three facts about")  # fmt: skip
TOPICS = ("the sea", "a robot", "the moon", "a small town",
          "coffee", "winter", "a library", "the desert")  # fmt: skip
STREAM_EXPECT = Expectations(
    "completion", 1, logprobs=TOP_LOGPROBS, include_usage=True, continuous_usage_stats=True
)
BODY_EXPECT = Expectations("completion", 1, logprobs=TOP_LOGPROBS)


@dataclasses.dataclass(slots=True)
class StalledServer:
    live: LiveServer
    # Off (stalls of 0 s) until the test sizes it.
    staller: LoopStaller
    model: str


@pytest.fixture(scope="module")
def server(embedded_model_config):
    config = EngineConfig(
        model=dataclasses.replace(embedded_model_config, max_model_len=4096),
        cache=CacheConfig(kv_cache_memory_bytes=512 << 20),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=64),
        multiprocess=True,
    )
    assembly = build_engine(config)
    staller = LoopStaller(every_s=LOOP_STALL_EVERY_S, for_s=0.0)
    with LiveServer(
        assembly.engine,
        assembly.model.tokenizer,
        model_name=assembly.model.name,
        max_model_len=assembly.model.max_model_len,
        startup_timeout_s=300,
        send_buffer_bytes=SEND_BUFFER_BYTES,
        send_timeout_s=SEND_TIMEOUT_S,
    ) as live:
        assert live.loop is not None, "the server runs"
        staller.start(live.loop)
        try:
            yield StalledServer(live, staller, assembly.model.name)
        finally:
            staller.stop()


@dataclasses.dataclass(slots=True)
class LoadRun:
    stream_bodies: list[bytes]
    num_long_prompts: int
    elapsed_s: float
    # Stream events that had to wait for a paused connection (the server's count).
    num_write_waits: int = 0


def stream_request(model: str, index: int) -> dict:
    prompt = f"{OPENINGS[index % len(OPENINGS)]} {TOPICS[index // len(OPENINGS)]}:"
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        # Every stream runs its full length: the same number of tokens to check.
        "ignore_eos": True,
        "logprobs": TOP_LOGPROBS,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def non_streamed(request: dict) -> dict:
    return {k: v for k, v in request.items() if k not in ("stream", "stream_options")}


@dataclasses.dataclass(frozen=True, slots=True)
class ReadPace:
    burst_bytes: int
    pause_s: float


def slow_pace(decode_step_s: float, bytes_per_token: float) -> ReadPace:
    """Bursts and pauses that read SLOW_READ_SLOWDOWN times slower than one
    stream produces (one token per decode step)."""
    low, high = SLOW_READ_PAUSE_RANGE_S
    pause_s = min(high, max(low, 2 * decode_step_s))
    rate = bytes_per_token / decode_step_s / SLOW_READ_SLOWDOWN
    return ReadPace(max(SLOW_READ_MIN_BYTES, int(rate * pause_s)), pause_s)


async def read_stream(
    session: aiohttp.ClientSession, url: str, body: dict, slow: ReadPace | None
) -> bytes:
    if slow is not None:
        status, raw = await asyncio.to_thread(
            read_slowly,
            url,
            body,
            burst_bytes=slow.burst_bytes,
            pause_s=slow.pause_s,
            receive_buffer_bytes=RECEIVE_BUFFER_BYTES,
        )
        assert status == 200, raw
        return raw
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def post_json(session: aiohttp.ClientSession, url: str, body: dict) -> bytes:
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def fetch_references(url: str, model: str) -> list[bytes]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        requests = [non_streamed(stream_request(model, i)) for i in range(NUM_STREAMS)]
        return list(await asyncio.gather(*(post_json(session, url, r) for r in requests)))


async def feed_long_prompts(
    session: aiohttp.ClientSession, url: str, body: dict, done: list[bytes]
) -> None:
    """Bursts of concurrent long prompts, each burst followed by a rest as long as it took."""
    while True:
        started_s = time.monotonic()
        # A different first token each time: fresh prompts, not repeats.
        prompts = [
            [1000 + len(done) + k, *body["prompt"]] for k in range(NUM_CONCURRENT_LONG_PROMPTS)
        ]
        done += await asyncio.gather(
            *(post_json(session, url, body | {"prompt": p}) for p in prompts)
        )
        await asyncio.sleep(time.monotonic() - started_s)


async def run_under_load(url: str, model: str, long_prompt: list[int], slow: ReadPace) -> LoadRun:
    long_body = {"model": model, "prompt": long_prompt, "max_tokens": 1, "temperature": 0}
    long_prompts_done: list[bytes] = []
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        feeder = asyncio.create_task(feed_long_prompts(session, url, long_body, long_prompts_done))
        started_s = time.monotonic()
        try:
            bodies = await asyncio.gather(
                *(
                    read_stream(
                        session,
                        url,
                        stream_request(model, i),
                        slow if i % 2 == 1 else None,
                    )
                    for i in range(NUM_STREAMS)
                )
            )
        finally:
            # A burst still in flight is dropped: its clients leave, the engine aborts it.
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
        elapsed_s = time.monotonic() - started_s
    return LoadRun(list(bodies), len(long_prompts_done), elapsed_s)


async def write_waits(base_url: str) -> int:
    """The server's `sluice:stream_write_waits_total`."""
    async with aiohttp.ClientSession() as session, session.get(base_url + "/metrics") as response:
        text = await response.text()
    (line,) = [
        line for line in text.splitlines() if line.startswith("sluice:stream_write_waits_total")
    ]
    return int(float(line.split()[-1]))


def tokens_per_chunk(body: bytes) -> list[int]:
    """Generated tokens in each choice chunk of a completions stream with logprobs."""
    counts = []
    for chunk in parse_sse(body):
        for choice in chunk["choices"]:
            logprobs = choice["logprobs"]
            counts.append(len(logprobs["tokens"]) if logprobs else 0)
    return counts


def check_against_reference(stream_body: bytes, reference_body: bytes) -> None:
    streamed = check_stream(stream_body, STREAM_EXPECT)
    reference = read_body(reference_body, BODY_EXPECT)
    (choice,), (expected,) = streamed.choices, reference.choices
    # I2: the same tokens in the same order, so none duplicated and none skipped.
    assert choice.token_strings == expected.token_strings
    assert choice.text == expected.text  # I1
    assert choice.text_offsets == expected.text_offsets  # I3
    assert choice.token_logprobs == pytest.approx(expected.token_logprobs, abs=LOGPROB_ATOL)
    assert choice.finish_reason == expected.finish_reason == "length"
    assert streamed.usage is not None and reference.usage is not None
    assert streamed.usage["completion_tokens"] == len(choice.token_strings) == MAX_TOKENS  # I5
    assert streamed.usage == reference.usage


def stall_for_s(decode_step_s: float) -> float:
    low, high = LOOP_STALL_FOR_S_RANGE
    return min(high, max(low, LOOP_STALL_IN_DECODE_STEPS * decode_step_s))


def test_lagging_streams_under_load_deliver_every_token_once_and_coalesce(server):
    url = server.live.url + "/v1/completions"
    filler = server.live.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 250)
    long_prompt = filler[: LONG_PROMPT_TOKENS - 1]

    async def scenario() -> tuple[list[bytes], float, LoadRun]:
        started_s = time.monotonic()
        references = await fetch_references(url, server.model)
        decode_step_s = (time.monotonic() - started_s) / MAX_TOKENS
        server.staller.for_s = stall_for_s(decode_step_s)
        waits_before = await write_waits(server.live.url)
        bytes_per_token = sum(map(len, references)) / len(references) / MAX_TOKENS
        slow = slow_pace(decode_step_s, bytes_per_token)
        load = await run_under_load(url, server.model, long_prompt, slow)
        load.num_write_waits = await write_waits(server.live.url) - waits_before
        return references, decode_step_s, load

    references, decode_step_s, load = asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))
    for stream_body, reference_body in zip(load.stream_bodies, references, strict=True):
        check_against_reference(stream_body, reference_body)
    counts = [n for body in load.stream_bodies for n in tokens_per_chunk(body)]
    num_coalesced = sum(n > 1 for n in counts)
    print(
        f"\ndecode step ~{decode_step_s:.2f} s, loop stalled {server.staller.for_s:.1f} s "
        f"every {LOOP_STALL_EVERY_S:.1f} s; {NUM_STREAMS} streams in {load.elapsed_s:.1f} s "
        f"beside {load.num_long_prompts} long prompts: {num_coalesced} of {len(counts)} chunks "
        f"carried more than one token (at most {max(counts)}), {sum(counts)} tokens; "
        f"{load.num_write_waits} events waited for a paused connection"
    )
    assert load.num_long_prompts >= NUM_CONCURRENT_LONG_PROMPTS, "long prompts kept arriving"
    assert server.staller.num_stalls >= 1, "the loop was stalled"
    assert load.num_write_waits >= 1, "no slow reader's transport paused: the test proved nothing"
    assert num_coalesced >= 1, "no chunk carried more than one token: the lag was not real"
