"""/v1/chat/completions responses, streamed and not, from the same choice deltas.

Both forms go through `_choice` (one `ChoiceDelta` -> content, logprob
entries; its tokens counted in `usage` by the frontend first); a stream sends each as a chunk, a non-streamed body is their
fold, so the two can never disagree. Invariants:
- The first chunk of each index is `{"role": "assistant", "content": ""}`,
  sent for every index before any content, together with the first tokens'
  chunks (as vLLM sends it; frontend/serving.py holds it back); `role` never repeats.
- Content chunks never carry empty content; only a finish chunk may have
  `delta: {}`. Every choice carries `finish_reason` (null until its last
  chunk) and `stop_reason`; `logprobs` is null on chunks without tokens.
- Chunks are "chat.completion.chunk" (the usage chunk too); the body is
  "chat.completion" with `message: {"role": "assistant", "content": ...}`.
- With output parsing (tools, reasoning), each choice's text goes through its
  `ParsedChoice` (chat_message.py): a delta whose text is all undecided yet
  makes no chunk (its tokens and logprob entries go with the next one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.frontend.chat_message import ParsedChoice, delta_fields
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.logprob_format import TokenStrings, chat_logprobs, vllm_prompt_logprobs
from sluice.frontend.request import GenerationRequest
from sluice.frontend.sse import (
    DONE_EVENT,
    TEXT_PLACEHOLDER,
    ChunkEvents,
    TextChoice,
    openai_error_events,
)
from sluice.frontend.usage import UsageCounter

CHUNK_OBJECT = "chat.completion.chunk"
BODY_OBJECT = "chat.completion"


@dataclass(slots=True)
class _FoldedChoice:
    content_parts: list[str] = field(default_factory=list)
    # logprobs.content entries, or None without logprobs.
    logprob_entries: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatChunks:
    """Chunks of one /v1/chat/completions request, streamed or folded into one body."""

    def __init__(self, request: GenerationRequest, strings: TokenStrings):
        self._request = request
        self._strings = strings
        self.usage = UsageCounter(request)
        self._events = ChunkEvents(
            request.response_id, CHUNK_OBJECT, request.created, request.model_name
        )
        # The usual chunk is content only: spliced, not built (`sse.TextChoice`).
        self._text_choices: list[TextChoice] | None = None
        # One per choice when its text is parsed (tool calls, reasoning).
        self._parsed: list[ParsedChoice] | None = None
        if request.output_parsing is not None:
            parsing = request.output_parsing
            self._parsed = [ParsedChoice(parsing) for _ in range(request.num_choices)]
        elif request.params.logprobs is None and not request.continuous_usage_stats:
            self._text_choices = [
                TextChoice.around(_choice_dict(index, {"content": TEXT_PLACEHOLDER}, None, None))
                for index in range(request.num_choices)
            ]
        self._folded = [_FoldedChoice() for _ in range(request.num_choices)]
        # vLLM's response-level `prompt_logprobs` (one prompt for every choice).
        self._prompt_logprobs: list[Any] | None = None
        if request.params.logprobs is not None:
            for folded in self._folded:
                folded.logprob_entries = []

    # -- streamed -------------------------------------------------------------

    def opening_events(self) -> list[bytes]:
        """One role chunk per index."""
        return [
            self._chunk_event(index, {"role": "assistant", "content": ""}, None, None, None)
            for index in range(self._request.num_choices)
        ]

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes | None:
        """The chunk of `delta`; None when parsing holds all of its text back."""
        if self._parsed is not None:
            return self._parsed_event(index, delta, self._parsed[index])
        if self._text_choices is not None and delta.finish_reason is None:
            assert delta.text, "only a finish chunk may have no content"
            return self._events.text_event(self._text_choices[index], delta.text)
        content, entries = self._choice(index, delta)
        assert content or delta.is_finished, "only a finish chunk may have no content"
        message = {"content": content} if content else {}
        logprobs = None if entries is None else {"content": entries}
        return self._chunk_event(index, message, logprobs, delta.finish_reason, delta.stop_reason)

    def _parsed_event(self, index: int, delta: ChoiceDelta, parsed: ParsedChoice) -> bytes | None:
        content, entries = self._choice(index, delta)
        message = delta_fields(parsed.push(content, delta.is_finished))
        entries = parsed.entries(entries, is_sent=bool(message) or delta.is_finished)
        if not message and not delta.is_finished:
            return None
        logprobs = None if entries is None else {"content": entries}
        finish_reason = parsed.finish_reason(delta.finish_reason)
        return self._chunk_event(index, message, logprobs, finish_reason, delta.stop_reason)

    def closing_events(self) -> list[bytes]:
        if not self._request.include_usage:
            return [DONE_EVENT]
        return [self._events.event(None, self.usage.total()), DONE_EVENT]

    def error_events(self, error: Exception) -> list[bytes]:
        return openai_error_events(error)

    # -- non-streamed ----------------------------------------------------------

    def fold(self, index: int, delta: ChoiceDelta) -> None:
        content, entries = self._choice(index, delta)
        folded = self._folded[index]
        if delta.prompt_logprobs is not None:
            self._prompt_logprobs = vllm_prompt_logprobs(
                self._request.prompts[0].token_ids, delta.prompt_logprobs, self._strings
            )
        if self._parsed is not None:
            self._parsed[index].fold(self._parsed[index].push(content, delta.is_finished))
        folded.content_parts.append(content)
        if entries is not None and folded.logprob_entries is not None:
            folded.logprob_entries.extend(entries)
        if delta.is_finished:
            folded.finish_reason = delta.finish_reason
            if self._parsed is not None:
                folded.finish_reason = self._parsed[index].finish_reason(delta.finish_reason)
            folded.stop_reason = delta.stop_reason

    def body(self) -> bytes:
        choices = [
            {
                "index": index,
                "message": self._message(index, folded),
                "logprobs": (
                    None if folded.logprob_entries is None else {"content": folded.logprob_entries}
                ),
                "finish_reason": folded.finish_reason,
                "stop_reason": folded.stop_reason,
            }
            for index, folded in enumerate(self._folded)
        ]
        response = self._envelope(BODY_OBJECT, choices)
        response["usage"] = self.usage.total()
        if self._request.params.prompt_logprobs is not None:
            response["prompt_logprobs"] = self._prompt_logprobs
        return orjson.dumps(response)

    def _message(self, index: int, folded: _FoldedChoice) -> dict[str, Any]:
        if self._parsed is not None:
            return self._parsed[index].message()
        return {"role": "assistant", "content": "".join(folded.content_parts)}

    # -- shared -----------------------------------------------------------------

    def _choice(self, index: int, delta: ChoiceDelta) -> tuple[str, list[dict[str, Any]] | None]:
        entries = None
        if self._request.params.logprobs is not None and delta.token_ids:
            entries = chat_logprobs(delta, self._strings)
        return delta.text, entries

    def _chunk_event(
        self,
        index: int,
        message: dict[str, Any],
        logprobs: dict[str, Any] | None,
        finish_reason: str | None,
        stop_reason: str | int | None,
    ) -> bytes:
        choice = _choice_dict(index, message, logprobs, finish_reason, stop_reason)
        if self._request.continuous_usage_stats:
            return self._events.event(choice, self.usage.for_choice(index))
        return self._events.event(choice)

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        request = self._request
        return {
            "id": request.response_id,
            "object": object_name,
            "created": request.created,
            "model": request.model_name,
            "choices": choices,
        }


def _choice_dict(
    index: int,
    message: dict[str, Any],
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "delta": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }
