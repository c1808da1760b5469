"""/v1/completions responses, streamed and not, from the same choice deltas.

Both forms go through `_choice`, which turns one `ChoiceDelta` into one choice
fragment (echo, logprobs, text offsets, usage counting); a stream sends each
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
from sluice.frontend.logprob_format import TokenStrings, completion_logprobs
from sluice.frontend.request import GenerationRequest
from sluice.frontend.sse import DONE_EVENT, encode_event
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


class CompletionChunks:
    """Chunks of one /v1/completions request, streamed or folded into one body."""

    def __init__(self, request: GenerationRequest, strings: TokenStrings):
        self._request = request
        self._strings = strings
        self.usage = UsageCounter(request)
        self._is_started = [False] * request.num_choices
        self._text_offsets = [0] * request.num_choices
        self._folded = [_FoldedChoice() for _ in range(request.num_choices)]
        if request.logprobs is not None:
            for folded in self._folded:
                folded.logprobs = {key: [] for key in _LOGPROB_KEYS}

    # -- streamed -------------------------------------------------------------

    def opening_events(self) -> list[bytes]:
        return []

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes:
        chunk = self._envelope([self._choice(index, delta)])
        if self._request.continuous_usage_stats:
            chunk["usage"] = self.usage.for_choice(index)
        return encode_event(chunk)

    def closing_events(self) -> list[bytes]:
        if not self._request.include_usage:
            return [DONE_EVENT]
        usage_chunk = self._envelope([])
        usage_chunk["usage"] = self.usage.total()
        return [encode_event(usage_chunk), DONE_EVENT]

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

    def body(self) -> bytes:
        choices = [
            {
                "index": index,
                "text": "".join(folded.text_parts),
                "logprobs": folded.logprobs,
                "finish_reason": folded.finish_reason,
                "stop_reason": folded.stop_reason,
            }
            for index, folded in enumerate(self._folded)
        ]
        response = self._envelope(choices)
        response["usage"] = self.usage.total()
        return orjson.dumps(response)

    # -- shared -----------------------------------------------------------------

    def _choice(self, index: int, delta: ChoiceDelta) -> dict[str, Any]:
        text = delta.text
        if not self._is_started[index]:
            self._is_started[index] = True
            if self._request.echo:
                prompt_text = self._request.prompts[index // self._request.n].text
                text = prompt_text + text
                self._text_offsets[index] = len(prompt_text)
        logprobs = None
        if self._request.logprobs is not None and delta.token_ids:
            logprobs, self._text_offsets[index] = completion_logprobs(
                delta, self._text_offsets[index], self._strings
            )
        self.usage.add(index, len(delta.token_ids))
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
        }

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        request = self._request
        return {
            "id": request.response_id,
            "object": OBJECT,
            "created": request.created,
            "model": request.model_name,
            "choices": choices,
        }
