"""Split UTF-8 and stop strings on the real tokenizer, over real sockets.

The embedded model (in-process engine) emits emoji and CJK as byte pieces,
one character spread over three tokens, so characters split across tokens
and across chunks. Streamed with and without logprobs, no delta may carry
U+FFFD and the text must equal the non-streamed text, also when max_tokens
cuts the last character in half. Stop strings are chosen from the model's
own greedy output so that they span token boundaries (by the tokens' text
offsets in a non-streamed response with logprobs): one between two word
tokens, one across the byte pieces of emoji. Streamed and not, with and
without `include_stop_str_in_output`, the text must end exactly at the stop
string, with finish_reason "stop" and the string as stop_reason.

Greedy decoding is deterministic here; the cases were picked by running them
(each test checks that its outputs still hold what it needs).
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest

from sluice.testing.contract import ChoiceResult, Expectations, check_stream, read_body
from sluice.testing.live_server import in_process_server

pytestmark = pytest.mark.slow

# Three tokens per character in these outputs: 15 ends on a whole character, 16 does not.
WHOLE_CHARACTERS_MAX_TOKENS = 15
CUT_CHARACTER_MAX_TOKENS = 16
STOP_CASE_MAX_TOKENS = 24
# Prompts whose greedy continuations are emoji or CJK.
CHAT_PROMPTS = ("Reply with only these characters repeated: 你好世界 🙂🚀",
                "Translate to Chinese: Hello world, good morning.")  # fmt: skip
COMPLETION_PROMPTS = ("中文：你好，世界。我爱", "Emoji list: 🙂 🚀 🎉 😀 🍕")
# Greedy continuations in plain words, then in emoji.
WORDS_PROMPT = "Here is a short poem about the sea:"
EMOJI_PROMPT = COMPLETION_PROMPTS[1]


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One request: where it goes, its body, and how to read the answer."""

    path: str
    body: dict
    expect: Expectations

    @property
    def is_stream(self) -> bool:
        return bool(self.body.get("stream"))


@pytest.fixture(scope="module")
def live(embedded_model_config):
    with in_process_server(embedded_model_config) as server:
        yield server


def stops_of(fields: dict) -> dict:
    """What the checker must know of a request's stop strings."""
    return {
        "stop": tuple(fields.get("stop") or ()),
        "include_stop_str": bool(fields.get("include_stop_str_in_output")),
    }


def chat_call(model: str, prompt: str, *, stream: bool, logprobs: bool, **fields) -> Call:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "stream": stream, "logprobs": logprobs, **fields}  # fmt: skip
    expect = Expectations("chat", 1, logprobs=0 if logprobs else None, **stops_of(fields))
    return Call("/v1/chat/completions", body, expect)


def completion_call(model: str, prompt: str, *, stream: bool, logprobs: bool, **fields) -> Call:
    body = {"model": model, "prompt": prompt, "temperature": 0, "ignore_eos": True,
            "stream": stream, "logprobs": 0 if logprobs else None, **fields}  # fmt: skip
    expect = Expectations("completion", 1, logprobs=0 if logprobs else None, **stops_of(fields))
    return Call("/v1/completions", body, expect)


async def post(session: aiohttp.ClientSession, url: str, call: Call) -> bytes:
    async with session.post(url + call.path, json=call.body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


def run_calls(url: str, calls: list[Call]) -> list[ChoiceResult]:
    """Send every call at once; each answer checked against the contract, read as one choice."""

    async def send_all() -> list[bytes]:
        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(post(session, url, call) for call in calls)))

    bodies = asyncio.run(asyncio.wait_for(send_all(), 600))
    results = []
    for call, body in zip(calls, bodies, strict=True):
        read = check_stream if call.is_stream else read_body
        (choice,) = read(body, call.expect).choices
        results.append(choice)
    return results


def variants(make, model: str, prompt: str, max_tokens: int) -> list[Call]:
    """The reference (non-streamed, logprobs) first, then streams without and with logprobs."""
    return [
        make(model, prompt, stream=False, logprobs=True, max_tokens=max_tokens),
        make(model, prompt, stream=True, logprobs=False, max_tokens=max_tokens),
        make(model, prompt, stream=True, logprobs=True, max_tokens=max_tokens),
    ]


def has_split_character(reference: ChoiceResult) -> bool:
    """A token released no text: its character was completed by a later token."""
    return "" in reference.token_strings


def test_characters_split_across_tokens_stream_whole_and_equal_the_body(live):
    model = live.app.state.routes.served_name
    groups = [variants(chat_call, model, p, WHOLE_CHARACTERS_MAX_TOKENS) for p in CHAT_PROMPTS]
    groups += [
        variants(completion_call, model, p, WHOLE_CHARACTERS_MAX_TOKENS) for p in COMPLETION_PROMPTS
    ]
    groups.append(variants(chat_call, model, CHAT_PROMPTS[0], CUT_CHARACTER_MAX_TOKENS))
    results = run_calls(live.url, [call for group in groups for call in group])
    for number, group in enumerate(groups):
        reference, *streams = results[3 * number : 3 * number + 3]
        prompt = group[0].body.get("prompt") or group[0].body["messages"][0]["content"]
        assert has_split_character(reference), f"no character split across tokens for {prompt!r}"
        assert any(len(c.encode()) > 1 for c in reference.text), f"no multi-byte char: {prompt!r}"
        assert "\ufffd" not in reference.text
        # check_stream already refused U+FFFD in every streamed delta.
        for stream in streams:
            assert stream.text == reference.text, prompt
            assert stream.finish_reason == reference.finish_reason == "length"
    # The cut case ended inside a character, whose piece is dropped (as the
    # detokenizer documents): one more token, no more text, streamed or not.
    assert results[-3].token_strings[-1] == ""
    assert results[-3].text == results[0].text


def spanning_stop(reference: ChoiceResult, *, across_pieces: bool) -> str:
    """A stop string over token boundaries near the middle of the reference text.

    Token k starts at character `text_offsets[k]`. Words: the last two
    characters of token k - 1 and the first two of token k. Pieces: a character
    token k completes after token k - 1 released nothing (its bytes spread over
    both), and the next character (more tokens). Its first occurrence must be
    that one, so the expected cut is known.
    """
    strings, offsets, text = reference.token_strings, reference.text_offsets, reference.text
    middle = len(strings) // 2
    for k in sorted(range(1, len(strings)), key=lambda k: abs(k - middle)):
        if across_pieces:
            fits = strings[k - 1] == "" and strings[k] != ""
            start, end = offsets[k], offsets[k] + 2
        else:
            fits = len(strings[k - 1]) >= 2 and len(strings[k]) >= 2
            start, end = offsets[k] - 2, offsets[k] + 2
        if fits and end <= len(text) and text.find(text[start:end]) == start:
            return text[start:end]
    raise AssertionError(f"no token boundary to put a stop string on in {text!r}")


def stop_calls(model: str, prompt: str, stop: str) -> list[Call]:
    """Non-streamed and streamed, with and without the stop string in the output."""

    def make(stream: bool, include: bool, logprobs: bool = False) -> Call:
        return completion_call(model, prompt, stream=stream, logprobs=logprobs,
                               max_tokens=STOP_CASE_MAX_TOKENS, stop=[stop],
                               include_stop_str_in_output=include)  # fmt: skip

    return [make(False, False), make(True, False), make(True, False, logprobs=True),
            make(False, True), make(True, True)]  # fmt: skip


def test_stop_strings_spanning_tokens_end_the_stream_exactly_where_the_body_ends(live):
    model = live.app.state.routes.served_name
    prompts = (WORDS_PROMPT, EMOJI_PROMPT)
    references = run_calls(
        live.url,
        [completion_call(model, p, stream=False, logprobs=True, max_tokens=STOP_CASE_MAX_TOKENS)
         for p in prompts],
    )  # fmt: skip
    stops = [spanning_stop(references[0], across_pieces=False),
             spanning_stop(references[1], across_pieces=True)]  # fmt: skip
    calls = [
        call for p, stop in zip(prompts, stops, strict=True) for call in stop_calls(model, p, stop)
    ]
    results = run_calls(live.url, calls)
    for call, result in zip(calls, results, strict=True):
        (stop,) = call.body["stop"]
        full = references[stops.index(stop)].text
        end = full.find(stop) + (len(stop) if call.body["include_stop_str_in_output"] else 0)
        assert result.text == full[:end], (stop, call.body)
        assert result.finish_reason == "stop" and result.stop_reason == stop
    print(f"\nstop strings {stops!r}: no leak, streamed == non-streamed")
