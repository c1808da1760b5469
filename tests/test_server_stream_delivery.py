"""Delivery order on the production path: the real app, a real `Frontend`, the
connection's own writer, an engine whose steps the test hands over by hand.

The sequences the first round's direct writes got wrong (issue 11): a client
whose connection is paused while several engine steps land in one pass of
the event loop, and an engine death while a refused write waits. Each event
the client receives is checked against the streaming contract and the text
against what the engine generated.
"""

from __future__ import annotations

import asyncio

import pytest

from sluice.config import ServerConfig
from sluice.server.http.app import create_app
from sluice.server.served_models.served_model import ServedModel
from sluice.testing.asgi_connection import PausableConnection
from sluice.testing.contract import Expectations, check_stream, parse_sse
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.manual_engine import ManualEngine

TOKENIZER = ChatFakeTokenizer()
PIECES = [TOKENIZER.encode(text) for text in (" a", " b", " c", " x", " y")]
EXPECT = Expectations(
    kind="completion",
    num_choices=1,
    logprobs=1,
    include_usage=True,
    continuous_usage_stats=True,
)


def completion_body(**overrides) -> dict:
    body = {
        "model": "fake-model",
        "prompt": "hello",
        "max_tokens": 100,
        "stream": True,
        "logprobs": 1,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    return body | overrides


class Harness:
    def __init__(self) -> None:
        self.engine = ManualEngine()
        self.app = create_app(
            ServerConfig(host="127.0.0.1", port=0),
            self.engine,
            ServedModel("fake-model", TOKENIZER, 4096),
        )
        self.connection = PausableConnection()
        self.task: asyncio.Task[None] | None = None

    async def start(self, **overrides) -> str:
        self.task = asyncio.create_task(
            self.connection.post(self.app, "/v1/completions", completion_body(**overrides))
        )
        await self.engine.request_added.wait()
        (request_id,) = self.engine.open_request_ids
        return request_id

    async def settle(self) -> None:
        """Let every ready callback and task run (nothing is timed)."""
        for _ in range(20):
            await asyncio.sleep(0)

    async def finish(self) -> bytes:
        assert self.task is not None
        self.connection.resume()
        await asyncio.wait_for(self.task, 10)
        return self.connection.body


def texts(body: bytes) -> list[str]:
    return [
        choice["text"]
        for payload in parse_sse(body)
        for choice in payload.get("choices", [])
        if choice["text"]
    ]


def test_steps_landing_together_while_the_connection_is_paused_keep_their_order():
    async def scenario() -> bytes:
        harness = Harness()
        request_id = await harness.start()
        harness.engine.deliver(request_id, PIECES[0])  # " a": written at once
        await harness.settle()
        harness.connection.pause()  # the client stops reading
        harness.engine.deliver(request_id, PIECES[1])  # refused: must wait
        harness.engine.deliver(request_id, PIECES[2])  # same pass of the loop
        await harness.settle()
        harness.connection.resume()
        await harness.settle()
        harness.engine.deliver(request_id, PIECES[3])
        harness.engine.deliver(request_id, PIECES[4], "length")
        return await harness.finish()

    body = asyncio.run(scenario())
    result = check_stream(body, EXPECT)
    expected = TOKENIZER.decode([i for piece in PIECES for i in piece])
    assert result.choices[0].text == "".join(texts(body)) == expected


def test_an_engine_death_behind_a_refused_write_loses_no_delta():
    async def scenario() -> bytes:
        harness = Harness()
        request_id = await harness.start()
        harness.engine.deliver(request_id, PIECES[0])
        await harness.settle()
        harness.connection.pause()
        harness.engine.deliver(request_id, PIECES[1])  # refused: must wait
        harness.engine.die()  # same pass of the loop
        return await harness.finish()

    body = asyncio.run(scenario())
    payloads = parse_sse(body)
    assert "".join(texts(body)) == TOKENIZER.decode(PIECES[0] + PIECES[1])
    assert "error" in payloads[-1]
    assert body.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("num_steps_per_pass", [2, 3, 5])
def test_bursts_of_steps_with_a_paused_reader_stay_exact(num_steps_per_pass):
    """Every few bursts the reader pauses for a while; whatever the pattern,
    cumulative usage only grows and the text arrives in order."""

    words = [TOKENIZER.encode(f" w{i}") for i in range(40)]

    async def scenario() -> bytes:
        harness = Harness()
        request_id = await harness.start()
        for burst in range(0, 40, num_steps_per_pass):
            if burst % (3 * num_steps_per_pass) == num_steps_per_pass:
                harness.connection.pause()
            for word in words[burst : burst + num_steps_per_pass]:
                harness.engine.deliver(request_id, word)
            await harness.settle()
            if burst % (3 * num_steps_per_pass) == 2 * num_steps_per_pass:
                harness.connection.resume()
                await harness.settle()
        harness.engine.deliver(request_id, PIECES[0], "length")
        return await harness.finish()

    body = asyncio.run(scenario())
    result = check_stream(body, EXPECT)
    ids = [i for word in words for i in word] + PIECES[0]
    assert result.choices[0].text == TOKENIZER.decode(ids)


class BreakingTokenizer(ChatFakeTokenizer):
    """Decoding one token id raises: a fault inside the stream's delta sink."""

    BROKEN_ID = PIECES[2][0]

    def decode(self, ids, *args, **kwargs):
        if self.BROKEN_ID in ids:
            raise RuntimeError("the detokenizer broke")
        return super().decode(ids, *args, **kwargs)


def test_a_failing_delta_sink_ends_its_stream_with_one_error_and_aborts_the_request():
    async def scenario() -> tuple[bytes, ManualEngine]:
        harness = Harness()
        harness.app = create_app(
            ServerConfig(host="127.0.0.1", port=0),
            harness.engine,
            ServedModel("fake-model", BreakingTokenizer(), 4096),
        )
        request_id = await harness.start()
        harness.engine.deliver(request_id, PIECES[0])
        harness.engine.deliver(request_id, PIECES[2])  # the sink raises
        body = await harness.finish()
        return body, harness.engine

    body, engine = asyncio.run(scenario())
    payloads = parse_sse(body)
    assert [p for p in payloads if "error" in p] == [payloads[-1]]
    assert payloads[-1]["error"]["type"] == "internal_server_error"  # no internals leak
    assert engine.aborted_request_ids  # the engine stops computing it
