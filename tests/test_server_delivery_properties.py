"""Property: on the production path, whatever lands in one pass of the event
loop and whenever the client stops reading, every chunk meets the contract.

Each example runs the real app (routes, `Frontend`, `StreamOutput`,
`EventStreamResponse`) over a `PausableConnection` (the connection's own
writer, paused and resumed by the test as a slow reader's TCP window would)
and a `ManualEngine` whose steps the test hands over by hand. The schedule is
a list of loop passes; in each pass, synchronously: engine steps of random
choices with 1-3 tokens each (several per pass, as when the ZMQ reader drains
its queue), pauses and resumes of the connection, at most one engine death;
then the loop runs a random number of rounds. Requests vary kind, n (1-3),
list prompts, logprobs and both usage modes.

The oracle for each choice is what its detokenizer releases from the tokens
delivered before the end (the finish, or the death): the stream must carry
exactly that text, with one logprob entry per released token at consecutive
positions (so no token is lost, repeated or moved), usage equal to the
tokens, and one error event at the end exactly when the engine died.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from sluice.config import ServerConfig
from sluice.frontend.detokenizer import IncrementalDetokenizer
from sluice.server.http.app import create_app
from sluice.server.served_models.served_model import ServedModel
from sluice.testing import fake_logprobs
from sluice.testing.asgi_connection import PausableConnection
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.manual_engine import ManualEngine

TOKENIZER = ChatFakeTokenizer()
TEXTS = st.text(alphabet=" ab😀語ไทย.", min_size=1, max_size=10)


@dataclass
class Choice:
    """One choice's script and what has been delivered of it."""

    token_ids: list[int]
    num_delivered: int = 0
    is_finished: bool = False
    detokenizer: IncrementalDetokenizer = field(
        default_factory=lambda: IncrementalDetokenizer(TOKENIZER, skip_special_tokens=True)
    )
    released: str = ""
    num_released_tokens: int = 0

    def take(self, count: int) -> list[int]:
        ids = self.token_ids[self.num_delivered : self.num_delivered + count]
        for token_id in ids:
            self.num_delivered += 1
            if text := self.detokenizer.push(token_id):
                self.released += text
                self.num_released_tokens = self.num_delivered
        return ids

    def finish(self) -> None:
        self.is_finished = True
        self.released += self.detokenizer.flush()
        self.num_released_tokens = self.num_delivered


@st.composite
def scenarios(draw: st.DrawFn):
    kind = draw(st.sampled_from(["completion", "chat"]))
    num_prompts = 1 if kind == "chat" else draw(st.integers(1, 2))
    n = draw(st.integers(1, 3))
    logprobs = draw(st.none() | st.integers(0, 2))
    include_usage = draw(st.booleans())
    continuous = draw(st.booleans())
    body: dict = {"model": "fake-model", "max_tokens": 500, "n": n, "stream": True}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
        if logprobs is not None:
            body |= {"logprobs": True, "top_logprobs": logprobs}
    else:
        body["prompt"] = ["hello", "there"][:num_prompts] if num_prompts > 1 else "hello"
        if logprobs is not None:
            body["logprobs"] = logprobs
    if include_usage or continuous:
        body["stream_options"] = {
            "include_usage": include_usage,
            "continuous_usage_stats": continuous,
        }
    num_choices = num_prompts * n
    scripts = [TOKENIZER.encode(draw(TEXTS)) for _ in range(num_choices)]
    action = st.one_of(
        st.tuples(st.just("deliver"), st.integers(0, num_choices - 1), st.integers(1, 3)),
        st.tuples(st.just("pause")),
        st.tuples(st.just("resume")),
    )
    passes = draw(st.lists(st.tuples(st.lists(action, max_size=6), st.integers(0, 4)), max_size=12))
    death_at = draw(st.none() | st.integers(0, len(passes) - 1)) if passes else None
    expect = Expectations(
        kind,
        num_choices,
        logprobs=logprobs,
        include_usage=include_usage,
        continuous_usage_stats=include_usage and continuous,  # vLLM's rule
        allows_error=death_at is not None,
    )
    return body, scripts, passes, death_at, expect


async def run(body: dict, scripts: list[list[int]], passes: list, death_at: int | None):
    engine = ManualEngine()
    model = ServedModel("fake-model", TOKENIZER, 4096)
    app = create_app(ServerConfig(host="127.0.0.1", port=0), engine, model)
    connection = PausableConnection()
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    task = asyncio.create_task(connection.post(app, path, body))
    while len(engine.added_request_ids) < len(scripts):
        await asyncio.sleep(0)
    ids = {int(rid.rsplit("-", 1)[1]): rid for rid in engine.added_request_ids}
    choices = [Choice(script) for script in scripts]

    def deliver(index: int, count: int) -> None:
        choice = choices[index]
        if choice.is_finished:
            return
        token_ids = choice.take(count)
        if choice.num_delivered == len(choice.token_ids):
            choice.finish()
            engine.deliver(ids[index], token_ids, "length")
        elif token_ids:
            engine.deliver(ids[index], token_ids)

    for position, (actions, num_rounds) in enumerate(passes):
        for action in actions:
            if action[0] == "deliver":
                deliver(action[1], action[2])
            elif action[0] == "pause":
                connection.pause()
            else:
                connection.resume()
        if position == death_at:
            engine.die()
            break
        for _ in range(num_rounds):
            await asyncio.sleep(0)
    if death_at is None:
        connection.resume()
        for index in range(len(choices)):
            deliver(index, len(scripts[index]))
    connection.resume()
    await asyncio.wait_for(task, 30)
    return connection, choices


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_every_chunk_meets_the_contract_whatever_lands_in_one_loop_pass(scenario):
    body, scripts, passes, death_at, expect = scenario
    connection, choices = asyncio.run(run(body, scripts, passes, death_at))
    note(f"wire: {connection.body!r}")
    if connection.status != 200:  # died before the first event: a real HTTP error
        assert death_at is not None and connection.status == 503
        assert all(not c.released for c in choices)
        return
    result = check_stream(connection.body, expect)  # wire, shape, I1-I5 on every chunk
    has_died_mid_stream = death_at is not None and not all(c.is_finished for c in choices)
    assert (result.error is not None) == has_died_mid_stream
    for got, choice in zip(result.choices, choices, strict=True):
        assert got.text == choice.released, "I1/I2: exactly the released text, in order"
        if expect.logprobs is not None:
            assert got.token_logprobs == [
                fake_logprobs(p, 0, 0)[0] for p in range(choice.num_released_tokens)
            ], "I2/I3: one entry per released token, none lost, repeated or moved"
        if choice.is_finished:
            assert got.finish_reason == "length"
    if result.usage is not None:
        assert result.usage["completion_tokens"] == sum(c.num_delivered for c in choices)
