"""The engine's `DeltaSink` for one API request: engine deltas in, choice deltas out.

`OutputProcessor.on_delta` runs on the event loop once per engine step for each
of the request's engine requests (one per choice, id f"{response_id}-{index}").
For each token, in order: detokenize, then check stop strings; what can be
released goes into the request's `StreamOutput` as one `ChoiceDelta`. Invariants:
- Text, the tokens that produced it and their logprob entries leave together:
  a token whose text is held (an incomplete character, a skipped special
  token, a possible stop-string prefix) is held with it, so every non-final
  `ChoiceDelta` carries text, and tokens past a stop-string match are dropped.
- Nothing empty is put: a step that released nothing (a prefill chunk, held
  text) puts nothing; a finish is always put, even without new text.
- A stop-string match finishes the choice ("stop", stop_reason = the string)
  and aborts its engine request; that request's later deltas are ignored.
- "abort" from the engine only happens when the client went away; one that
  reaches a live request is turned into an error.
- As in vLLM, a finishing stop token (EOS or a stop_token_id) is delivered and
  counted but not detokenized unless `include_stop_str_in_output`; its text
  is never searched for stop strings, so it keeps its own stop_reason.
- As in vLLM (since its PR 22014), stop strings wait for `min_tokens`: a match
  counts only if it ends in text released by output token min_tokens + 1 or
  later, the rule the engine applies to EOS and stop_token_ids. It may start
  in earlier text; earlier text alone never matches and is sent as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from sluice.engine.client_base import EngineRequests
from sluice.engine.outputs import PromptLogprobs, RequestDelta, TokenLogprobs
from sluice.errors import ServiceUnavailableError
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.detokenizer import DecodingTokenizer, IncrementalDetokenizer
from sluice.frontend.request import GenerationRequest
from sluice.frontend.stop_checker import StopChecker, StopRelease
from sluice.frontend.stream_output import StreamOutput


def engine_request_id(response_id: str, index: int) -> str:
    return f"{response_id}-{index}"


@dataclass(slots=True)
class _TokenGroup:
    """Tokens whose text is released together, by the last of them."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[SampledLogprob] = field(default_factory=list)
    text: str = ""


class ChoiceStream:
    """One choice's pipeline: detokenizer, then stop checker (if it has stop strings)."""

    def __init__(self, index: int, request: GenerationRequest, tokenizer: DecodingTokenizer):
        self.index = index
        self.is_finished = False
        # True when a stop string finished the choice before the engine did.
        self.is_stopped_early = False
        self._eos_token_ids = tokenizer.eos_token_ids
        self._wants_logprobs = request.params.logprobs is not None
        self._detokenizes_stop_token = request.include_stop_str_in_output
        # Stop strings may only end in text of output tokens after these.
        self._min_tokens = request.params.min_tokens
        # Tokens pushed to the detokenizer so far (by the general path: the
        # plain path has no stop checker, the counter's only reader).
        self._num_detokenized_tokens = 0
        self._detokenizer = IncrementalDetokenizer(
            tokenizer,
            skip_special_tokens=request.skip_special_tokens,
            spaces_between_special_tokens=request.spaces_between_special_tokens,
        )
        # None without stop strings: then text leaves as soon as it is released
        # (the common case, per token, so it skips the checker's bookkeeping).
        self._stop_checker: StopChecker[_TokenGroup] | None = None
        if any(request.stop):
            self._stop_checker = StopChecker(
                request.stop, include_stop_str_in_output=request.include_stop_str_in_output
            )
        # Tokens whose text is not released yet, and their logprob entries.
        self._held_token_ids: list[int] = []
        self._held_logprobs: list[SampledLogprob] = []
        # No logprobs and no stop strings: a step's token only needs detokenizing.
        self._is_plain = not self._wants_logprobs and self._stop_checker is None
        # The engine's prompt logprobs until the choice's first delta carries them.
        self.prompt_logprobs: PromptLogprobs | None = None

    def process(self, delta: RequestDelta) -> ChoiceDelta | None:
        """The choice delta `delta` releases, or None when it releases nothing."""
        if self._is_plain and delta.finish_reason is None and len(delta.new_token_ids) == 1:
            return self._process_plain_token(delta)
        out: ChoiceDelta | None = None
        last = len(delta.new_token_ids) - 1
        for position, token_id in enumerate(delta.new_token_ids):
            self._held_token_ids.append(token_id)
            if self._wants_logprobs and delta.logprobs is not None:
                self._held_logprobs.append(_sampled_logprob(delta.logprobs, position))
            is_stop_token = position == last and token_id == delta.stop_token_id
            if is_stop_token and not self._detokenizes_stop_token:
                continue
            self._num_detokenized_tokens += 1
            text = self._detokenizer.push(token_id)
            if not text:
                continue
            if out is None:
                out = self._new_delta(delta)
            may_match = not is_stop_token and self._num_detokenized_tokens > self._min_tokens
            if self._release_text(out, text, may_match):
                return out
        if delta.finish_reason is not None:
            if out is None:
                out = self._new_delta(delta)
            self._finish(out, delta)
        # Empty when the stop checker held all the text released.
        return None if out is None or out.is_empty else out

    def _process_plain_token(self, delta: RequestDelta) -> ChoiceDelta | None:
        """`process` of the usual step: one token, no logprobs, no stop strings.
        The same result, with none of the general case's bookkeeping."""
        (token_id,) = delta.new_token_ids
        text = self._detokenizer.push(token_id)
        if not text or self._held_token_ids:
            self._held_token_ids.append(token_id)
            if not text:
                return None
            out = self._new_delta(delta)
            self._release_text(out, text)
            return out
        return ChoiceDelta(
            text, [token_id], [text], None, None, None,
            delta.num_prompt_tokens, delta.num_cached_tokens,
        )  # fmt: skip

    def _new_delta(self, delta: RequestDelta) -> ChoiceDelta:
        logprobs: list[SampledLogprob] | None = [] if self._wants_logprobs else None
        return ChoiceDelta(
            "", [], [], logprobs, None, None, delta.num_prompt_tokens, delta.num_cached_tokens
        )

    def _release_text(self, out: ChoiceDelta, text: str, may_match: bool = True) -> bool:
        """Release `text` with the held tokens that made it; True when that finished
        the choice. Without `may_match`, no stop string may end in `text`."""
        held_token_ids = self._held_token_ids
        assert held_token_ids, "released text always comes with the tokens that made it"
        if self._stop_checker is None:
            out.text += text
            out.token_ids += held_token_ids
            if len(held_token_ids) > 1:
                out.token_texts += [""] * (len(held_token_ids) - 1)
            out.token_texts.append(text)
            held_token_ids.clear()
            if out.logprobs is not None:
                out.logprobs += self._held_logprobs
                self._held_logprobs.clear()
            return False
        group = _TokenGroup(held_token_ids, self._held_logprobs, text)
        self._held_token_ids, self._held_logprobs = [], []
        return self._release(out, self._stop_checker.push(text, group, may_match=may_match))

    def _release(self, out: ChoiceDelta, release: StopRelease[_TokenGroup]) -> bool:
        """Append what the stop checker released to `out`; True when it matched."""
        out.text += release.text
        for group in release.payloads:
            out.token_ids += group.token_ids
            out.token_texts += [""] * (len(group.token_ids) - 1)
            out.token_texts.append(group.text)
            if out.logprobs is not None:
                out.logprobs += group.logprobs
        if release.stop_string is None:
            return False
        self.is_finished = self.is_stopped_early = True
        out.finish_reason = "stop"
        out.stop_reason = release.stop_string
        return True

    def _finish(self, out: ChoiceDelta, delta: RequestDelta) -> None:
        """The engine finished: flush what is held, then close the choice."""
        text = self._detokenizer.flush()
        # What the last detokenized token still held: a stop token's is not searched.
        has_stop_text = delta.stop_token_id is not None and self._detokenizes_stop_token
        may_match = not has_stop_text and self._num_detokenized_tokens > self._min_tokens
        if (text or self._held_token_ids) and self._release_text(out, text, may_match):
            return
        if self._stop_checker is not None:
            self._release(out, self._stop_checker.flush())
        self.is_finished = True
        out.finish_reason = delta.finish_reason
        if delta.stop_token_id not in self._eos_token_ids:
            out.stop_reason = delta.stop_token_id  # vLLM reports EOS as None


def _sampled_logprob(logprobs: TokenLogprobs, position: int) -> SampledLogprob:
    return SampledLogprob(
        logprobs.logprobs[position],
        logprobs.top_token_ids[position],
        logprobs.top_logprobs[position],
    )


class OutputProcessor:
    """Routes one API request's engine deltas to its choices and its output."""

    def __init__(
        self,
        request: GenerationRequest,
        tokenizer: DecodingTokenizer,
        engine: EngineRequests,
        output: StreamOutput,
    ):
        self._engine = engine
        self._output = output
        self._choices = {
            engine_request_id(request.response_id, index): ChoiceStream(index, request, tokenizer)
            for index in range(request.num_choices)
        }
        self._is_closed = False
        self._is_echo_only = request.is_echo_only

    @property
    def unfinished_request_ids(self) -> list[str]:
        return [rid for rid, choice in self._choices.items() if not choice.is_finished]

    def close(self) -> None:
        """Stop: nothing more is put, whatever the engine still sends."""
        self._is_closed = True

    def on_delta(self, delta: RequestDelta) -> None:
        choice = self._choices.get(delta.request_id)
        if self._is_closed or choice is None or choice.is_finished:
            return
        if delta.finish_reason == "abort":
            choice.is_finished = True
            error = ServiceUnavailableError(f"the engine aborted request {delta.request_id}")
            self._output.put_error(error)
            return
        if self._is_echo_only:  # its one sampled token is not part of the answer
            delta = msgspec.structs.replace(
                delta, new_token_ids=(), logprobs=None, stop_token_id=None
            )
        if delta.prompt_logprobs is not None:
            choice.prompt_logprobs = delta.prompt_logprobs
        out = choice.process(delta)
        if out is not None:
            out.prompt_logprobs, choice.prompt_logprobs = choice.prompt_logprobs, None
            self._output.put(choice.index, out)
        if choice.is_stopped_early and delta.finish_reason is None:
            self._engine.abort([delta.request_id])

    def on_error(self, error: BaseException) -> None:
        if not self._is_closed:
            self._output.put_error(error)
