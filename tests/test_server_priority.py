"""The `priority` request field over HTTP: chat, completions, the Responses
and Messages APIs carry it to the engine's SamplingParams; a server that
schedules fcfs refuses a non-zero one by name, as vLLM does; bad values are
400s. On the engine process with a tiny model: high-priority streams preempt a
running batch, finish first, and every stream equals its non-streamed twin."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx2
import pytest

from sluice.config import EngineConfig, SchedulerConfig
from sluice.testing.contract import Expectations, check_stream, read_body
from sluice.testing.fake_engine import LoopFakeEngine, parrot
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer
from sluice.testing.stream_reader import read_stream

MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 2},
}


class RecordedPriorities:
    def __init__(self) -> None:
        self.priorities: list[int] = []

    def __call__(self, request_id, prompt, params):
        self.priorities.append(params.priority)
        return parrot(request_id, prompt, params)


def serve(script, policy: str) -> LiveServer:
    engine_config = EngineConfig(scheduler=SchedulerConfig(scheduling_policy=policy))
    return LiveServer(LoopFakeEngine(script), ChatFakeTokenizer(), engine=engine_config)


@pytest.mark.parametrize("path", list(BODIES))
def test_each_route_carries_priority_to_the_engine(path):
    script = RecordedPriorities()
    with serve(script, "priority") as live, httpx2.Client(base_url=live.url) as client:
        for priority in (-3, None, 7):
            fields = {} if priority is None else {"priority": priority}
            response = client.post(path, json={"model": MODEL, **BODIES[path], **fields})
            assert response.status_code == 200, response.text
    assert script.priorities == [-3, 0, 7]


@pytest.mark.parametrize("path", list(BODIES))
def test_a_fcfs_server_refuses_a_priority_by_name_and_takes_zero(path):
    with serve(parrot, "fcfs") as live, httpx2.Client(base_url=live.url) as client:
        refused = client.post(path, json={"model": MODEL, **BODIES[path], "priority": 1})
        assert refused.status_code == 400
        if path == "/v1/messages":
            assert "priority" in refused.json()["error"]["message"]
        else:
            assert refused.json()["error"]["param"] == "priority"
        zero = client.post(path, json={"model": MODEL, **BODIES[path], "priority": 0})
        assert zero.status_code == 200


@pytest.mark.parametrize("bad", ["high", 1.5, 2**63, [1], {"p": 1}, True])
def test_a_priority_that_is_not_a_64_bit_integer_is_a_400(bad):
    with serve(parrot, "priority") as live, httpx2.Client(base_url=live.url) as client:
        for path in BODIES:
            response = client.post(path, json={"model": MODEL, **BODIES[path], "priority": bad})
            assert response.status_code == 400, (path, bad, response.text)


# -- on the default engine (its own process), a tiny model -------------------------

LONG, SHORT = 180, 12
EXACT = Expectations(kind="completion", num_choices=1, logprobs=1, allows_replacement_char=True)


def greedy(prompt: str, max_tokens: int, priority: int, *, stream: bool = True) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream, "logprobs": 1, "priority": priority}  # fmt: skip


async def batch_then_chats(url: str) -> tuple[list, list]:
    """Two long low-priority streams take both seats; once they stream, two
    high-priority ones arrive."""
    async with aiohttp.ClientSession() as session:
        streaming = [asyncio.Event(), asyncio.Event()]
        batch = [
            asyncio.create_task(read_stream(
                session, url, greedy(f"batch {i}", LONG, 5),
                on_event=lambda record, i=i: len(record.events) >= 3 and streaming[i].set(),
            ))
            for i in range(2)
        ]  # fmt: skip
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), 120)
        chats = [read_stream(session, url, greedy(f"chat {i}", SHORT, -5)) for i in range(2)]
        chat_records = await asyncio.gather(*chats)
        return list(await asyncio.gather(*batch)), chat_records


def test_preempted_streams_on_the_engine_process_equal_their_twins(tiny_folder):
    from sluice.config import CacheConfig, ModelConfig
    from sluice.server.http.launch import build_engine

    model = ModelConfig(model=str(tiny_folder), dtype="float32", quantization=None,
                        activation_quantization=None, max_model_len=256)  # fmt: skip
    config = EngineConfig(
        model=model,
        cache=CacheConfig(kv_cache_memory_bytes=8 << 20),
        scheduler=SchedulerConfig(scheduling_policy="priority", max_num_seqs=2),
    )
    assembly = build_engine(config)
    with LiveServer(assembly.engine, assembly.model.tokenizer, model_name=assembly.model.name,
                    max_model_len=256, engine=config, startup_timeout_s=120) as live:  # fmt: skip
        url = live.url + "/v1/completions"
        batch, chats = asyncio.run(batch_then_chats(url))
        # The chats took the batch's seats: both batch streams were preempted.
        assert preemptions(live) >= 2
        # Every chat finished before either batch stream.
        assert max(chat.ended_s for chat in chats) < min(record.ended_s for record in batch)
        for record, (prompt, max_tokens) in zip(
            batch + chats, [("batch 0", LONG), ("batch 1", LONG), ("chat 0", SHORT),
                            ("chat 1", SHORT)], strict=True
        ):  # fmt: skip
            streamed = check_stream(record.raw, EXACT)
            twin = httpx2.post(url, json=greedy(prompt, max_tokens, 0, stream=False), timeout=60)
            alone = read_body(twin.content, EXACT).choices[0]
            assert streamed.choices[0].text == alone.text
            assert streamed.choices[0].token_logprobs == pytest.approx(alone.token_logprobs,
                                                                       abs=1e-4)  # fmt: skip


def preemptions(live: LiveServer) -> float:
    text = httpx2.get(live.url + "/metrics").text
    (line,) = [line for line in text.splitlines() if line.startswith("vllm:num_preemptions_total")]
    return float(line.split()[-1])
