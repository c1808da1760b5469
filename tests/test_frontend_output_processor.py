"""The output processor: engine deltas in, whole choice deltas out, stops abort."""

from __future__ import annotations

import asyncio

import pytest

from sluice.engine.outputs import RequestDelta, TokenLogprobs
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import EngineDeadError, ServiceUnavailableError
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.mailbox import Mailbox
from sluice.frontend.output_processor import OutputProcessor
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.testing import FakeEngine, FakeTokenizer

TOKENIZER = FakeTokenizer()
T = TOKENIZER.token_id
EOS = TOKENIZER.eos_token_id


def make_request(**overrides) -> GenerationRequest:
    fields = {
        "kind": "completion",
        "response_id": "cmpl-1",
        "created": 0,
        "model_name": "m",
        "prompts": (PromptInput((5, 6, 7), "p"),),
        "n": 1,
        "params": SamplingParams(max_tokens=100),
    }
    return GenerationRequest(**(fields | overrides))


def delta(
    ids: list[int],
    *,
    finish: str | None = None,
    stop_token_id: int | None = None,
    request_id: str = "cmpl-1-0",
    logprobs: bool = False,
) -> RequestDelta:
    entries = None
    if logprobs:
        entries = TokenLogprobs(
            tuple(-1.0 - i for i in range(len(ids))),
            tuple((i,) for i in range(len(ids))),
            tuple((-2.0,) for _ in ids),
        )
    return RequestDelta(request_id, tuple(ids), entries, finish, stop_token_id, 3)


class Harness:
    def __init__(self, **overrides):
        self.engine = FakeEngine()
        self.mailbox = Mailbox()
        self.processor = OutputProcessor(
            make_request(**overrides), TOKENIZER, self.engine, self.mailbox
        )

    def feed(self, *deltas: RequestDelta) -> dict[int, ChoiceDelta]:
        for item in deltas:
            self.processor.on_delta(item)
        if self.mailbox.is_empty:
            return {}
        return asyncio.run(self.mailbox.get())


def test_a_delta_without_tokens_or_finish_puts_nothing():
    assert Harness().feed(delta([])) == {}


def test_a_finish_without_new_text_still_goes_through():
    harness = Harness()
    harness.feed(delta([T("a")]))
    out = harness.feed(delta([], finish="length"))[0]
    assert (out.text, out.token_ids, out.finish_reason) == ("", [], "length")


def test_a_split_character_travels_with_all_its_tokens_and_logprobs():
    harness = Harness(logprobs=1)
    first, second = TOKENIZER.token_id("😀[:2]"), TOKENIZER.token_id("😀[2:]")
    assert harness.feed(delta([T("a"), first], logprobs=True))[0].token_ids == [T("a")]
    out = harness.feed(delta([second], logprobs=True))[0]
    assert (out.text, out.token_ids, out.token_texts) == ("😀", [first, second], ["", "😀"])
    assert out.logprobs is not None and len(out.logprobs) == 2


def test_a_stop_string_finishes_the_choice_drops_later_tokens_and_aborts_the_engine():
    harness = Harness(stop=("STOP",))
    out = harness.feed(delta([T("a"), T("STOP"), T("b")]))[0]
    assert (out.text, out.token_ids) == ("a", [T("a"), T("STOP")])
    assert (out.finish_reason, out.stop_reason) == ("stop", "STOP")
    assert harness.engine.aborted_request_ids == ["cmpl-1-0"]
    assert harness.feed(delta([T("c")]), delta([], finish="abort")) == {}
    assert harness.processor.unfinished_request_ids == []


def test_a_stop_string_in_the_engines_last_delta_needs_no_abort():
    harness = Harness(stop=("STOP",))
    out = harness.feed(delta([T("STOP")], finish="length"))[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", "STOP")
    assert harness.engine.aborted_request_ids == []


def test_held_stop_prefix_is_flushed_when_the_engine_finishes():
    harness = Harness(stop=("abc",))
    assert harness.feed(delta([T("x"), T("ab")])) == {0: harness_text_delta("x")}
    out = harness.feed(delta([], finish="length"))[0]
    assert (out.text, out.token_ids, out.finish_reason) == ("ab", [T("ab")], "length")


def harness_text_delta(text: str) -> ChoiceDelta:
    return ChoiceDelta(text=text, token_ids=[T(text)], token_texts=[text], num_prompt_tokens=3)


def test_eos_is_delivered_but_not_shown_and_reported_as_no_stop_reason():
    harness = Harness(skip_special_tokens=False)
    out = harness.feed(delta([T("a"), EOS], finish="stop", stop_token_id=EOS))[0]
    assert (out.text, out.token_ids, out.stop_reason) == ("a", [T("a"), EOS], None)


def test_a_stop_token_id_is_reported_as_the_stop_reason():
    harness = Harness()
    out = harness.feed(delta([T("a"), T("b")], finish="stop", stop_token_id=T("b")))[0]
    assert (out.text, out.token_ids, out.stop_reason) == ("a", [T("a"), T("b")], T("b"))


def test_include_stop_str_in_output_detokenizes_the_stop_token():
    harness = Harness(include_stop_str_in_output=True)
    out = harness.feed(delta([T("a"), T("b")], finish="stop", stop_token_id=T("b")))[0]
    assert out.text == "ab"


def test_an_engine_abort_reaching_a_live_request_becomes_an_error():
    harness = Harness()
    harness.processor.on_delta(delta([T("a")]))
    harness.processor.on_delta(delta([], finish="abort"))

    async def read() -> None:
        assert (await harness.mailbox.get())[0].text == "a"
        with pytest.raises(ServiceUnavailableError):
            await harness.mailbox.get()

    asyncio.run(read())


def test_choices_are_routed_by_engine_request_id():
    harness = Harness(n=2, prompts=(PromptInput((1,), "p"),))
    out = harness.feed(delta([T("a")], request_id="cmpl-1-1"), delta([T("b")]))
    assert (out[0].text, out[1].text) == ("b", "a")


def test_nothing_is_put_after_close_and_errors_go_through_the_mailbox():
    harness = Harness()
    harness.processor.on_error(EngineDeadError("gone"))
    assert not harness.mailbox.is_empty
    closed = Harness()
    closed.processor.close()
    closed.processor.on_delta(delta([T("a")]))
    closed.processor.on_error(EngineDeadError("gone"))
    assert closed.mailbox.is_empty
