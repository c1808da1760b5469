"""Speculative decoding over HTTP, on real sockets: a tiny model served with
n-gram speculation on and the same model with it off. Streams whose engine
steps carry several tokens at once, half of them read slowly through a tiny
receive window, keep every promise of docs/STREAMING_CONTRACT.md (checked by
the audit's checker) and equal, token for token and logprob for logprob, the
non-streamed answers of the server without speculation; a stop string cuts
the text where it does without; /metrics counts the drafts under vLLM's names."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import aiohttp
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.config import CacheConfig, EngineConfig, ModelConfig, SpeculativeConfig
from sluice.testing.contract import Expectations, check_stream, parse_sse, read_body
from sluice.testing.live_server import LiveServer
from sluice.testing.slow_socket import read_slowly
from sluice.testing.stream_reader import read_stream

MAX_TOKENS = 48
NUM_STREAMS = 6
EXPECT = Expectations(
    kind="completion",
    num_choices=1,
    logprobs=2,
    include_usage=True,
    continuous_usage_stats=True,
    allows_replacement_char=True,
)
BODY_EXPECT = Expectations(
    kind="completion", num_choices=1, logprobs=2, allows_replacement_char=True
)
NGRAM = SpeculativeConfig(num_speculative_tokens=6, prompt_lookup_min=1, prompt_lookup_max=3)


@contextmanager
def serve(folder: Path, speculative: SpeculativeConfig | None) -> Iterator[LiveServer]:
    from sluice.engine.core import EngineCore
    from sluice.engine.inproc_client import InProcessEngineClient

    config = EngineConfig(
        # Batch-invariant: the engine speculates only where a row's bits
        # ignore its step's row count (engine/startup.py `speculation_blocker`).
        model=ModelConfig(model=str(folder), dtype="float32", quantization=None,
                          activation_quantization=None, max_model_len=256,
                          batch_invariant=True),
        cache=CacheConfig(kv_cache_memory_bytes=8 << 20),
        multiprocess=False,
        speculative_config=speculative,
    )  # fmt: skip
    core = EngineCore(config)
    with LiveServer(
        InProcessEngineClient(core), core.loaded.tokenizer, model_name=core.loaded.name,
        max_model_len=256, engine=config, startup_timeout_s=120,
    ) as live:  # fmt: skip
        yield live


@pytest.fixture(scope="module")
def servers(tiny_folder) -> Iterator[tuple[LiveServer, LiveServer]]:
    with ExitStack() as stack:
        on = stack.enter_context(serve(tiny_folder, NGRAM))
        off = stack.enter_context(serve(tiny_folder, None))
        yield on, off


def body(prompt: str, *, stream: bool = True, **fields) -> dict:
    request = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
               "ignore_eos": True, "logprobs": 2, "stream": stream, **fields}  # fmt: skip
    if stream:
        request["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return request


def prompt(i: int) -> str:
    """Text that repeats itself with one change, different per stream."""
    line = f"item {i}: the cat sat on mat {i}; "
    return line * 4 + line.replace("cat", "dog") + line


async def fast_streams(url: str, prompts: list[str]) -> list[bytes]:
    async with aiohttp.ClientSession() as session:
        records = await asyncio.gather(*(read_stream(session, url, body(p)) for p in prompts))
    return [record.raw for record in records]


def tokens_per_chunk(stream_body: bytes) -> list[int]:
    return [
        len(choice["logprobs"]["tokens"])
        for chunk in parse_sse(stream_body)
        for choice in chunk["choices"]
        if choice["logprobs"]
    ]


def counter(live: LiveServer, name: str) -> float:
    text = httpx2.get(live.url + "/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def test_lagging_speculative_streams_keep_the_contract_and_equal_the_plain_answers(servers):
    on, off = servers
    url = on.url + "/v1/completions"
    prompts = [prompt(i) for i in range(NUM_STREAMS)]
    slow = prompts[: NUM_STREAMS // 2]
    with ThreadPoolExecutor(len(slow)) as pool:
        slow_bodies = pool.map(
            lambda p: read_slowly(
                url, body(p), burst_bytes=64, pause_s=0.05, receive_buffer_bytes=512
            ),
            slow,
        )
        fast_bodies = asyncio.run(fast_streams(url, prompts[len(slow) :]))
        streamed_bodies = [raw for status, raw in slow_bodies] + fast_bodies
    counts = []
    for text, stream_body in zip(prompts, streamed_bodies, strict=True):
        streamed = check_stream(stream_body, EXPECT)
        twin = httpx2.post(off.url + "/v1/completions", json=body(text, stream=False), timeout=60)
        (expected,), (choice,) = read_body(twin.content, BODY_EXPECT).choices, streamed.choices
        assert choice.token_strings == expected.token_strings  # I2: each token once, in order
        assert choice.text == expected.text  # I1
        assert choice.text_offsets == expected.text_offsets
        assert choice.token_logprobs == pytest.approx(expected.token_logprobs, abs=1e-4)
        assert choice.finish_reason == expected.finish_reason == "length"
        assert streamed.usage["completion_tokens"] == len(choice.token_strings) == MAX_TOKENS
        counts += tokens_per_chunk(stream_body)
    accepted = counter(on, "vllm:spec_decode_num_accepted_tokens_total")
    drafted = counter(on, "vllm:spec_decode_num_draft_tokens_total")
    print(f"\naccepted {accepted:.0f} of {drafted:.0f} drafted tokens; tokens per chunk {counts}")
    assert 0 < accepted <= drafted
    assert counter(on, "vllm:spec_decode_num_drafts_total") > 0
    assert max(counts) > 1, "no chunk carried several tokens"


def test_a_stop_string_cuts_a_speculative_stream_where_it_cuts_a_plain_one(servers):
    on, off = servers
    text = prompt(7)
    plain = httpx2.post(off.url + "/v1/completions", json=body(text, stream=False), timeout=60)
    generated = read_body(plain.content, BODY_EXPECT).choices[0].text
    stop = generated[len(generated) // 2 : len(generated) // 2 + 2]
    expect = Expectations(kind="completion", num_choices=1, logprobs=2, include_usage=True,
                          continuous_usage_stats=True, allows_replacement_char=True,
                          stop=(stop,))  # fmt: skip
    with httpx2.Client(timeout=60) as client:
        streamed = check_stream(
            client.post(on.url + "/v1/completions", json=body(text, stop=[stop])).content, expect
        )
        twin = client.post(off.url + "/v1/completions", json=body(text, stream=False, stop=[stop]))
    body_expect = Expectations(kind="completion", num_choices=1, logprobs=2,
                               allows_replacement_char=True, stop=(stop,))  # fmt: skip
    expected = read_body(twin.content, body_expect).choices[0]
    assert streamed.choices[0].text == expected.text == generated[: generated.index(stop)]
    assert streamed.choices[0].finish_reason == expected.finish_reason == "stop"
