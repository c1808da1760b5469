"""One max_tokens policy for every API: the same ask near the context limit
gets the same effective max_tokens on chat, completions, Responses and
Messages (or the same 400 where an API refuses what an agent API lowers)."""

from __future__ import annotations

import asyncio

import pytest

from sluice.apis.chat.protocol import ChatCompletionRequest
from sluice.apis.chat.to_internal import chat_request
from sluice.apis.completions.protocol import CompletionRequest
from sluice.apis.completions.to_internal import completion_request
from sluice.apis.messages.protocol import MessagesRequest
from sluice.apis.messages.to_internal import messages_request
from sluice.apis.openai_request import RequestOptions
from sluice.apis.responses.protocol import ResponsesRequest
from sluice.apis.responses.to_internal import responses_request
from sluice.config import GenerationDefaults, RequestLimits
from sluice.errors import ContextLengthError
from sluice.frontend.preprocess import Preprocessor
from sluice.testing.fake_tokenizer import ChatFakeTokenizer

# The room every request's prompt leaves in the context.
ROOM = 20
TEXT = "hello there"


def options_leaving_room(num_prompt_tokens: int, **fields) -> RequestOptions:
    preprocessor = Preprocessor(ChatFakeTokenizer(), num_prompt_tokens + ROOM)
    return RequestOptions("m", preprocessor, **fields)


def prompt_tokens_of(build) -> int:
    """The prompt's length as the API builds it (a context with room for any)."""
    request = asyncio.run(build(options_leaving_room(10_000)))
    return len(request.prompts[0].token_ids)


def effective_max_tokens(api: str, max_tokens: int | None, **fields) -> int:
    def build(options: RequestOptions):
        messages = [{"role": "user", "content": TEXT}]
        if api == "completions":
            body = CompletionRequest(prompt=TEXT, max_tokens=max_tokens)
            return completion_request(body, options)
        if api == "chat":
            return chat_request(ChatCompletionRequest(messages=messages, max_tokens=max_tokens),
                                options)  # fmt: skip
        if api == "responses":
            body = ResponsesRequest(input=TEXT, max_output_tokens=max_tokens)
            return _plan_request(responses_request(body, options, []))
        body = MessagesRequest(model="m", messages=messages, max_tokens=max_tokens)
        return messages_request(body, options)

    options = options_leaving_room(prompt_tokens_of(build), **fields)
    return asyncio.run(build(options)).params.max_tokens


async def _plan_request(plan):
    return (await plan).request


ALL_APIS = ["completions", "chat", "responses", "messages"]


@pytest.mark.parametrize("api", ALL_APIS)
def test_a_default_above_the_limit_is_capped_before_the_context_judges_it(api):
    # The server's default (100) is beyond the room (20), the limit (8) is not:
    # every API runs 8. Chat used to fit first and refuse this with a 400.
    fields = {"limits": RequestLimits(max_tokens=8),
              "generation_defaults": GenerationDefaults(max_new_tokens=100)}  # fmt: skip
    asked = 100 if api == "messages" else None  # Messages requires max_tokens
    assert effective_max_tokens(api, asked, **fields) == 8


@pytest.mark.parametrize("api", ALL_APIS)
def test_an_ask_that_fits_runs_as_asked_on_every_api(api):
    assert effective_max_tokens(api, ROOM) == ROOM


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_beyond_the_room_is_a_400_on_chat_and_completions(api):
    with pytest.raises(ContextLengthError):
        effective_max_tokens(api, ROOM + 1)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_beyond_the_room_is_lowered_to_it_on_the_agent_apis(api):
    assert effective_max_tokens(api, 32_000) == ROOM


def test_messages_lowers_beyond_the_limit_then_to_the_room():
    assert effective_max_tokens("messages", 32_000, limits=RequestLimits(max_tokens=8)) == 8
