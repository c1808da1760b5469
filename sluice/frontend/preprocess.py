"""Prompt preprocessing: chat template, tokenization and context-length checks.

Runs on the event loop for each API request, before anything reaches the
engine. Invariants:
- CPU-heavy work on large inputs (rendering the chat template of a
  conversation, encoding a long prompt) runs in a worker thread via
  `asyncio.to_thread`, so one huge request never stalls other streams; small
  inputs are handled inline, where a thread hop would cost more than the work.
- Every prompt that leaves here is non-empty, uses only ids below the
  vocabulary size, and fits the context together with its `max_tokens`;
  anything else raises a typed `RequestError` naming the field.

Context-length policy (OpenAI's, also vLLM's):
- `max_tokens` given: prompt + max_tokens > max_model_len is a 400 whose
  message carries both numbers; nothing is silently shortened.
- `max_tokens` not given and no default (chat): the request may use the rest
  of the context, max_model_len - prompt tokens; a prompt that leaves no room
  is a 400 with both numbers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sluice.errors import ContextLengthError, InvalidRequestError, PromptTooLongError
from sluice.frontend.request import PromptInput

# Inputs longer than this (in characters) are processed off the event loop.
OFFLOAD_THRESHOLD_CHARS = 8192


class PromptTokenizer(Protocol):
    """The part of `sluice.tokenizer.Tokenizer` preprocessing uses."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def has_chat_template(self) -> bool: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        *,
        tools: list[dict] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class MessageToolCall:
    """A tool call an earlier assistant turn made."""

    id: str
    name: str
    # The JSON text the call was made with.
    arguments: str

    def as_template_dict(self) -> dict[str, Any]:
        # HF templates (Qwen2.5's, Llama's) render `arguments | tojson`: they
        # expect the object, not its text (vLLM passes it parsed too). Text
        # that is not JSON is passed as it came.
        try:
            arguments = json.loads(self.arguments)
        except ValueError:
            arguments = self.arguments
        function = {"name": self.name, "arguments": arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One conversation turn, its content already flattened to text."""

    role: str
    content: str
    # Optional author name and tool call id; templates that know them use them.
    name: str | None = None
    tool_call_id: str | None = None
    # An assistant turn's tool calls.
    tool_calls: tuple[MessageToolCall, ...] = ()

    def as_template_dict(self) -> dict[str, Any]:
        # Jinja chat templates index messages as dicts: this is their one format.
        fields: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            fields["name"] = self.name
        if self.tool_call_id is not None:
            fields["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            fields["tool_calls"] = [call.as_template_dict() for call in self.tool_calls]
        return fields


class Preprocessor:
    """Turns prompts and conversations into `PromptInput`s for one served model."""

    def __init__(
        self,
        tokenizer: PromptTokenizer,
        max_model_len: int,
        offload_threshold_chars: int = OFFLOAD_THRESHOLD_CHARS,
    ):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.offload_threshold_chars = offload_threshold_chars

    # -- text and ids ----------------------------------------------------------

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of `text`; long texts are encoded in a worker thread."""
        if len(text) > self.offload_threshold_chars:
            return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens)

    async def decode(self, token_ids: Sequence[int]) -> str:
        if len(token_ids) > self.offload_threshold_chars // 4:
            return await asyncio.to_thread(self.tokenizer.decode, token_ids, False)
        return self.tokenizer.decode(token_ids, False)

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        vocab_size = self.tokenizer.vocab_size
        for token_id in token_ids:
            if not 0 <= token_id < vocab_size:
                raise InvalidRequestError(
                    f"token id {token_id} is outside the vocabulary (size {vocab_size})",
                    param=param,
                )

    # -- prompts -----------------------------------------------------------------

    async def text_prompt(self, text: str, add_special_tokens: bool, param: str) -> PromptInput:
        if not text:
            raise InvalidRequestError("the prompt is empty", param=param)
        token_ids = await self.encode(text, add_special_tokens)
        if not token_ids:
            raise InvalidRequestError("the prompt encodes to no tokens", param=param)
        return PromptInput(token_ids=tuple(token_ids), text=text)

    async def token_prompt(
        self, token_ids: Sequence[int], param: str, *, needs_text: bool
    ) -> PromptInput:
        """A prompt given as ids. Its text is decoded only when `needs_text`
        (echo): decoding a long prompt nobody reads would be wasted work."""
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", param=param)
        self.check_token_ids(token_ids, param)
        text = await self.decode(token_ids) if needs_text else ""
        return PromptInput(token_ids=tuple(token_ids), text=text)

    async def chat_prompt(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool,
        add_special_tokens: bool,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> PromptInput:
        text = await self.render_chat(messages, add_generation_prompt, tools, template_kwargs)
        return await self.text_prompt(text, add_special_tokens, param="messages")

    async def render_chat(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat template applied to `messages` (and `tools`, in the request's
        shape, when given; `template_kwargs`: its extra variables, e.g.
        `enable_thinking`); large conversations render in a thread."""
        if not self.tokenizer.has_chat_template:
            raise InvalidRequestError("this model has no chat template", param="messages")
        template_messages = [message.as_template_dict() for message in messages]
        num_chars = sum(len(message.content) for message in messages)
        # Tokenizers without tool support (test fakes) are called without the keywords.
        extra: dict[str, Any] = {} if tools is None else {"tools": tools}
        if template_kwargs:
            extra["template_kwargs"] = template_kwargs
        if num_chars > self.offload_threshold_chars:
            return await asyncio.to_thread(
                self.tokenizer.apply_chat_template,
                template_messages,
                add_generation_prompt,
                **extra,
            )
        return self.tokenizer.apply_chat_template(template_messages, add_generation_prompt, **extra)

    # -- context -----------------------------------------------------------------

    def fit_max_tokens(
        self, prompts: Sequence[PromptInput], max_tokens: int | None, prompt_param: str
    ) -> int:
        """The `max_tokens` every prompt can use; see the module docstring's policy.

        `max_tokens` None means "the rest of the context" of the longest prompt.
        """
        num_prompt_tokens = max(len(prompt.token_ids) for prompt in prompts)
        room = self.max_model_len - num_prompt_tokens
        if max_tokens is None:
            if room < 1:
                raise PromptTooLongError(
                    f"This model's maximum context length is {self.max_model_len} tokens, "
                    f"but the prompt has {num_prompt_tokens} tokens, leaving no room "
                    "to generate.",
                    num_prompt_tokens=num_prompt_tokens,
                    max_prompt_tokens=self.max_model_len - 1,
                    param=prompt_param,
                )
            return room
        if max_tokens > room:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {num_prompt_tokens + max_tokens} tokens "
                f"({num_prompt_tokens} in the prompt, {max_tokens} for the completion). "
                "Please reduce the prompt or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return max_tokens
