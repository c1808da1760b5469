"""Bounded resources: per-request limits are 400s naming the field; connections are capped."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx2
import pytest

from sluice.config import RequestLimits
from sluice.testing.event_loops import run
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.stream_reader import completion_body, read_stream

LIMITS = RequestLimits(
    max_prompt_tokens=40,
    max_n=2,
    max_tokens=50,
    max_stop_strings=2,
    max_stop_string_chars=8,
    max_logit_bias_entries=2,
    max_request_body_bytes=4096,
)
MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def live():
    engine = LoopFakeEngine(step_interval_s=0.01)
    tokenizer = ChatFakeTokenizer()
    with LiveServer(engine, tokenizer, limits=LIMITS, max_connections=MAX_CONNECTIONS) as server:
        yield server


@pytest.fixture
def http(live):
    with httpx2.Client(base_url=live.url, timeout=10) as client:
        yield client


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3}, "n"),
        ({"max_tokens": 51}, "max_tokens"),
        ({"stop": ["a", "b", "c"]}, "stop"),
        ({"stop": ["a", "123456789"]}, "stop"),
        ({"stop": "123456789"}, "stop"),
        ({"logit_bias": {"5": 1, "6": 1, "7": 1}}, "logit_bias"),
        ({"prompt": "hello " * 60}, "prompt"),
    ],
)
def test_each_completion_limit_is_a_400_naming_its_field(http, fields, param):
    response = http.post("/v1/completions", json={"prompt": "hello", **fields})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and "more than this server's limit" in error["message"]


def test_chat_limits_name_the_chat_fields(http):
    messages = [{"role": "user", "content": "hello " * 60}]
    too_long = http.post("/v1/chat/completions", json={"messages": messages})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "messages"
    short = [{"role": "user", "content": "hi"}]
    too_many = http.post(
        "/v1/chat/completions", json={"messages": short, "max_completion_tokens": 51}
    )
    assert too_many.json()["error"]["param"] == "max_completion_tokens"


def test_requests_within_the_limits_are_served_and_a_default_max_tokens_is_capped(http):
    messages = [{"role": "user", "content": "hi"}]
    body = http.post("/v1/chat/completions", json={"messages": messages, "n": 2}).json()
    # Chat's default is the rest of the context; the limit caps it at 50 instead.
    assert body["usage"]["completion_tokens"] == 2 * LIMITS.max_tokens
    ok = http.post(
        "/v1/completions", json={"prompt": "hello", "stop": ["x", "12345678"], "max_tokens": 50}
    )
    assert ok.status_code == 200


def test_a_body_beyond_the_byte_limit_is_refused(http):
    response = http.post("/v1/completions", json={"prompt": "x" * 5000, "max_tokens": 1})
    assert response.status_code == 413
    assert "limit of 4096 bytes" in response.json()["error"]["message"]


def test_connections_beyond_the_cap_get_503_while_the_others_are_served(live):
    async def go():
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            url = live.url + "/v1/completions"
            # uvicorn counts the new connection too: cap - 1 others fill it.
            started = [asyncio.Event() for _ in range(MAX_CONNECTIONS - 1)]
            holders = [
                asyncio.create_task(
                    read_stream(
                        session,
                        url,
                        completion_body(50),
                        on_event=lambda record, event=event: event.set(),
                    )  # fmt: skip
                )
                for event in started
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 10)
            async with session.get(live.url + "/health") as extra:
                extra_status = extra.status
            return extra_status, await asyncio.gather(*holders)

    extra_status, holders = run(go())
    assert extra_status == 503
    assert all(record.status == 200 and record.is_done for record in holders)
