"""The output processor: engine deltas in, whole choice deltas out, stops abort."""

from __future__ import annotations

import asyncio

import pytest

from sluice.engine.outputs import RequestDelta, TokenLogprobs
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import EngineDeadError, ServiceUnavailableError
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.output_processor import ChoiceStream, OutputProcessor
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.stream_output import StreamOutput
from sluice.testing import FakeTokenizer

TOKENIZER = FakeTokenizer()
T = TOKENIZER.token_id
EOS = TOKENIZER.eos_token_id


def make_request(logprobs: int | None = None, **overrides) -> GenerationRequest:
    fields = {
        "kind": "completion",
        "response_id": "cmpl-1",
        "created": 0,
        "model_name": "m",
        "prompts": (PromptInput((5, 6, 7), "p"),),
        "n": 1,
        "params": SamplingParams(max_tokens=100, logprobs=logprobs),
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


class AbortRecorder:
    """All the processor asks of its engine: to abort (the deltas are fed by hand)."""

    def __init__(self) -> None:
        self.aborted_request_ids: list[str] = []

    def abort(self, request_ids: list[str]) -> None:
        self.aborted_request_ids.extend(request_ids)


class Harness:
    """The processor feeding a real StreamOutput; `feed` returns what one hand-over takes."""

    def __init__(self, **overrides):
        self.engine = AbortRecorder()
        request = make_request(**overrides)
        self.taken: list[dict[int, ChoiceDelta]] = []
        self.output = StreamOutput(request.num_choices, self._render)
        self.processor = OutputProcessor(request, TOKENIZER, self.engine, self.output)

    def _render(self, taken: list[tuple[int, ChoiceDelta]]) -> list[bytes]:
        self.taken.append(dict(taken))
        return [b"rendered"]

    def feed(self, *deltas: RequestDelta) -> dict[int, ChoiceDelta]:
        for item in deltas:
            self.processor.on_delta(item)
        if not self.output.has_pending:
            return {}
        return asyncio.run(self.take())

    async def take(self) -> dict[int, ChoiceDelta]:
        await self.output.next_events()
        return self.taken.pop()


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
        assert (await harness.take())[0].text == "a"
        with pytest.raises(ServiceUnavailableError):
            await harness.take()

    asyncio.run(read())


def test_choices_are_routed_by_engine_request_id():
    harness = Harness(n=2, prompts=(PromptInput((1,), "p"),))
    out = harness.feed(delta([T("a")], request_id="cmpl-1-1"), delta([T("b")]))
    assert (out[0].text, out[1].text) == ("b", "a")


def test_nothing_is_put_after_close_and_errors_go_through_the_output():
    harness = Harness()
    harness.processor.on_error(EngineDeadError("gone"))
    assert harness.output.has_pending
    closed = Harness()
    closed.processor.close()
    closed.processor.on_delta(delta([T("a")]))
    closed.processor.on_error(EngineDeadError("gone"))
    assert not closed.output.has_pending


# -- stop strings against min_tokens and a finishing stop token ----------------------


def stream_ids(
    ids: list[int],
    *,
    per_token: bool = True,
    finish: str = "length",
    stop_token_id: int | None = None,
    **overrides,
) -> tuple[str, list[int], str | None, str | int | None]:
    """Feed `ids` to one ChoiceStream (one delta each, or one delta in all), the
    last carrying `finish`; (text, token ids, finish_reason, stop_reason)."""
    choice = ChoiceStream(0, make_request(**overrides), TOKENIZER)
    batches = [[token_id] for token_id in ids] if per_token else [ids]
    text, token_ids, finish_reason, stop_reason = "", [], None, None
    for number, batch in enumerate(batches):
        is_last = number == len(batches) - 1
        out = choice.process(
            delta(
                batch,
                finish=finish if is_last else None,
                stop_token_id=stop_token_id if is_last else None,
            )
        )
        if out is not None:
            text += out.text
            token_ids += out.token_ids
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
        if choice.is_finished:
            break
    return text, token_ids, finish_reason, stop_reason


SENTENCES = TOKENIZER.encode(" a b c. x y. z")  # 13 tokens; "." is token 6 and token 11


@pytest.mark.parametrize("per_token", [True, False])
def test_stop_strings_are_searched_only_after_min_tokens_tokens(per_token):
    text, token_ids, finish, stop_reason = stream_ids(
        SENTENCES,
        per_token=per_token,
        stop=(".",),
        params=SamplingParams(max_tokens=100, min_tokens=10),
    )
    assert (text, finish, stop_reason) == ("a b c. x y", "stop", ".")
    assert token_ids == SENTENCES[:11]


def test_without_min_tokens_the_first_stop_string_finishes():
    text, token_ids, _, stop_reason = stream_ids(SENTENCES, stop=(".",))
    assert (text, len(token_ids), stop_reason) == ("a b c", 6, ".")


@pytest.mark.parametrize(
    ("min_tokens", "stop", "expected"),
    [
        # " y." starts in tokens 9-10 and ends in token 11: a stop once 10 came before.
        (10, " y.", ("a b c. x", "stop", " y.")),
        # The same match ends in token 11 itself: not a stop when min_tokens is 11.
        (11, " y.", ("a b c. x y. z", "length", None)),
        (11, ".", ("a b c. x y. z", "length", None)),
        # ". " ends in token 7 (too early), then starts in token 11 and ends in 12.
        (11, ". ", ("a b c. x y", "stop", ". ")),
    ],
)
def test_a_stop_string_counts_when_its_last_character_comes_after_min_tokens(
    min_tokens, stop, expected
):
    params = SamplingParams(max_tokens=100, min_tokens=min_tokens)
    text, _, finish, stop_reason = stream_ids(SENTENCES, stop=(stop,), params=params)
    assert (text, finish, stop_reason) == expected


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("stop", ["</", "b </", "s>"])
def test_the_eos_text_is_included_but_never_searched_for_stop_strings(per_token, stop):
    ids = [T("a"), T("▁"), T("b"), EOS]
    text, token_ids, finish, stop_reason = stream_ids(
        ids,
        per_token=per_token,
        finish="stop",
        stop_token_id=EOS,
        stop=(stop,),
        skip_special_tokens=False,
        include_stop_str_in_output=True,
    )
    assert (text, token_ids, finish, stop_reason) == ("a b </s>", ids, "stop", None)


def test_a_stop_token_ids_text_is_never_searched_and_it_stays_the_stop_reason():
    ids = [T("a"), T("</"), T("end>")]
    text, token_ids, finish, stop_reason = stream_ids(
        ids,
        finish="stop",
        stop_token_id=T("end>"),
        stop=("</end>", "end"),
        include_stop_str_in_output=True,
    )
    assert (text, token_ids, finish, stop_reason) == ("a</end>", ids, "stop", T("end>"))


def test_a_stop_string_before_the_stop_token_still_wins():
    ids = [T("a"), T("</"), EOS]
    text, token_ids, finish, stop_reason = stream_ids(
        ids, per_token=False, finish="stop", stop_token_id=EOS, stop=("</",),
        skip_special_tokens=False, include_stop_str_in_output=True,
    )  # fmt: skip
    assert (text, token_ids, finish, stop_reason) == ("a</", ids[:2], "stop", "</")


@pytest.mark.parametrize(("min_tokens", "expected"), [(1, ("a", "x")), (2, ("ax", None))])
def test_text_flushed_at_the_end_belongs_to_the_last_token_that_was_detokenized(
    min_tokens, expected
):
    # Token 2 holds "x" with half an emoji; EOS (token 3) ends it: the flush releases "x".
    ids = [T("a"), T("x😀[:3]"), EOS]
    params = SamplingParams(max_tokens=100, min_tokens=min_tokens)
    text, _, finish, stop_reason = stream_ids(
        ids, finish="stop", stop_token_id=EOS, stop=("x",), params=params
    )
    assert (text, stop_reason) == expected and finish == "stop"
