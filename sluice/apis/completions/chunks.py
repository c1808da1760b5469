"""/v1/completions responses, streamed and not, from the same choice deltas.

Both forms go through `_choice`, which turns one `ChoiceDelta` into one choice
fragment (echo, logprobs, text offsets; its tokens counted in `usage` by the
frontend first); a stream sends each
fragment as a chunk, a non-streamed body is the fold of the fragments. So the
two can never disagree. Invariants:
- `object` is "text_completion" on every chunk, the usage chunk included;
  `id`, `created`, `model` are the request's on every chunk.
- Every choice carries `finish_reason` (null until its last chunk) and
  `stop_reason`; `logprobs` is null on chunks without tokens.
- `echo` prepends the prompt text to the first fragment of each index
  (index = prompt_index * n + i); text offsets count it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.logprob_format import (
    TokenStrings,
    completion_logprobs,
    echo_logprobs,
    vllm_prompt_logprobs,
)
from sluice.frontend.request import GenerationRequest
from sluice.frontend.sse import (
    DONE_EVENT,
    TEXT_PLACEHOLDER,
    ChunkEvents,
    TextChoice,
    openai_error_events,
)
from sluice.frontend.usage import UsageCounter

OBJECT = "text_completion"
_LOGPROB_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


@dataclass(slots=True)
class _FoldedChoice:
    text_parts: list[str] = field(default_factory=list)
    # The four completions lists, or None without logprobs.
    logprobs: dict[str, list[Any]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # vLLM's per-choice `prompt_logprobs`, when the request computed them.
    prompt_logprobs: list[Any] | None = None


class CompletionChunks:
    """Chunks of one /v1/completions request, streamed or folded into one body."""

    def __init__(self, request: GenerationRequest, strings: TokenStrings):
        self._request = request
        self._strings = strings
        self.usage = UsageCounter(request)
        self._events = ChunkEvents(request.response_id, OBJECT, request.created, request.model_name)
        self._has_continuous_usage = request.continuous_usage_stats
        self._wants_logprobs = request.params.logprobs is not None
        # The usual chunk is text only: spliced, not built (`sse.TextChoice`).
        self._text_choices: list[TextChoice] | None = None
        if not (request.echo or self._wants_logprobs or self._has_continuous_usage):
            self._text_choices = [
                TextChoice.around(_choice_dict(index, TEXT_PLACEHOLDER, None, None, None))
                for index in range(request.num_choices)
            ]
        self._is_started = [False] * request.num_choices
        self._text_offsets = [0] * request.num_choices
        self._folded = [_FoldedChoice() for _ in range(request.num_choices)]
        if request.params.logprobs is not None:
            for folded in self._folded:
                folded.logprobs = {key: [] for key in _LOGPROB_KEYS}

    # -- streamed -------------------------------------------------------------

    def opening_events(self) -> list[bytes]:
        return []

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes:
        if self._text_choices is not None and delta.finish_reason is None:
            return self._events.text_event(self._text_choices[index], delta.text)
        choice = self._choice(index, delta)
        if self._has_continuous_usage:
            return self._events.event(choice, self.usage.for_choice(index))
        return self._events.event(choice)

    def closing_events(self) -> list[bytes]:
        if not self._request.include_usage:
            return [DONE_EVENT]
        return [self._events.event(None, self.usage.total()), DONE_EVENT]

    def error_events(self, error: Exception) -> list[bytes]:
        return openai_error_events(error)

    # -- non-streamed ----------------------------------------------------------

    def fold(self, index: int, delta: ChoiceDelta) -> None:
        choice = self._choice(index, delta)
        folded = self._folded[index]
        folded.text_parts.append(choice["text"])
        if choice["logprobs"] is not None and folded.logprobs is not None:
            for key in _LOGPROB_KEYS:
                folded.logprobs[key].extend(choice["logprobs"][key])
        if delta.is_finished:
            folded.finish_reason = delta.finish_reason
            folded.stop_reason = delta.stop_reason
        if delta.prompt_logprobs is not None:
            prompt = self._request.prompts[index // self._request.n]
            folded.prompt_logprobs = vllm_prompt_logprobs(
                prompt.token_ids, delta.prompt_logprobs, self._strings
            )

    def body(self) -> bytes:
        choices = [
            {
                "index": index,
                "text": "".join(folded.text_parts),
                "logprobs": folded.logprobs,
                "finish_reason": folded.finish_reason,
                "stop_reason": folded.stop_reason,
                **_prompt_logprobs_field(self._request, folded),
            }
            for index, folded in enumerate(self._folded)
        ]
        response = self._envelope(choices)
        response["usage"] = self.usage.total()
        return orjson.dumps(response)

    # -- shared -----------------------------------------------------------------

    def _choice(self, index: int, delta: ChoiceDelta) -> dict[str, Any]:
        text = delta.text
        logprobs = None
        if not self._is_started[index]:
            self._is_started[index] = True
            if self._request.echo:
                prompt = self._request.prompts[index // self._request.n]
                text = prompt.text + text
                self._text_offsets[index] = len(prompt.text)
                logprobs = self._echo_logprobs(prompt.token_ids, delta)
        if self._wants_logprobs and delta.token_ids:
            fragment, self._text_offsets[index] = completion_logprobs(
                delta, self._text_offsets[index], self._strings
            )
            logprobs = fragment if logprobs is None else _joined(logprobs, fragment)
        return _choice_dict(index, text, logprobs, delta.finish_reason, delta.stop_reason)

    def _echo_logprobs(
        self, prompt_token_ids: tuple[int, ...], delta: ChoiceDelta
    ) -> dict[str, list[Any]] | None:
        """The echoed prompt's logprob lists (before the choice's own)."""
        if not self._wants_logprobs:
            return None
        assert delta.prompt_logprobs is not None, "echo with logprobs computes the prompt's"
        fragment, _ = echo_logprobs(prompt_token_ids, delta.prompt_logprobs, self._strings)
        return fragment

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        request = self._request
        return {
            "id": request.response_id,
            "object": OBJECT,
            "created": request.created,
            "model": request.model_name,
            "choices": choices,
        }


def _joined(first: dict[str, list[Any]], later: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {key: first[key] + later[key] for key in _LOGPROB_KEYS}


def _prompt_logprobs_field(request: GenerationRequest, folded: _FoldedChoice) -> dict[str, Any]:
    if request.params.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": folded.prompt_logprobs}


def _choice_dict(
    index: int,
    text: str,
    logprobs: dict[str, list[Any]] | None,
    finish_reason: str | None,
    stop_reason: str | int | None,
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }
