"""What the output processor hands the consumer for one choice: `ChoiceDelta`.

A ChoiceDelta carries released text together with the tokens that produced it
and their logprob entries; the three always travel together. Invariants:
- `token_ids`, `token_texts` and (when present) `logprobs` have equal length.
- `"".join(token_texts) == text`, except on the delta that finishes a choice
  through a stop string: there `text` lacks the trimmed stop string (when not
  included) and whatever followed it inside the completing token.
- Only a finishing delta may carry no text.

`merge` appends a later delta of the same choice in place (the stream
output's slot does it while the consumer lags), so many engine steps become
one delta with the same content as the steps one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.engine.outputs import FinishReason, PromptLogprobs


@dataclass(frozen=True, slots=True)
class SampledLogprob:
    """The logprob of one sampled token and its top alternatives."""

    logprob: float
    # Most likely first; may or may not contain the sampled token.
    top_token_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(slots=True)
class ChoiceDelta:
    # Text released since the choice's previous delta.
    text: str = ""
    # Tokens released with that text, in generation order.
    token_ids: list[int] = field(default_factory=list)
    # The text each token released: "" for a token whose text came with a later
    # token (a partial UTF-8 character, a skipped special token), the whole
    # released text on the token that completed it.
    token_texts: list[str] = field(default_factory=list)
    # None when the request did not ask for logprobs; else one per token.
    logprobs: list[SampledLogprob] | None = None
    # Set on the choice's last delta only; never "abort".
    finish_reason: FinishReason | None = None
    # vLLM's stop_reason: the matched stop string or the stop token id (not EOS).
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    # Of those, the tokens found in the engine's prefix cache.
    num_cached_tokens: int = 0
    # On the choice's first delta only, when the request asked for them.
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_empty(self) -> bool:
        return not self.text and not self.token_ids and self.finish_reason is None

    def merge(self, later: ChoiceDelta) -> None:
        """Append `later` (the same choice's next delta) to this one."""
        assert self.finish_reason is None, "nothing follows a finished choice's delta"
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        self.token_texts.extend(later.token_texts)
        if later.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(later.logprobs)
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason
        self.num_prompt_tokens = later.num_prompt_tokens
        self.num_cached_tokens = later.num_cached_tokens
