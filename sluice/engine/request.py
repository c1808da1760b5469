"""One engine request as the engine loop sees it: mutable, owned by the engine
loop alone (scheduler, KV accounting, update), never shared outside it.

One counter model: a request needs computing while
`num_computed_tokens < num_tokens`. Prefill and decode are the same thing: a
fresh request has its whole prompt to compute, a decoding request has the one
token sampled last step, a preempted request has everything (prompt and the
outputs so far) again. After a step that brings `num_computed_tokens` up to
`num_tokens`, the runner samples one token and `num_tokens` grows by one.

Invariants:
- `all_token_ids == prompt_token_ids + output_token_ids`, kept as one list
  appended in place (the runner slices it; nothing is re-concatenated).
- `0 <= num_computed_tokens <= num_tokens`.
- `output_token_ids[num_emitted_tokens:]` and the pending logprob lists are
  exactly what the next delta carries; `take_delta` empties them, so every
  token leaves the engine once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.engine.outputs import FinishReason, PromptLogprobs, RequestDelta, TokenLogprobs
from sluice.engine.sampled import PromptLogprobsChunk, SampledToken
from sluice.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from sluice.engine.ngram_proposer import NgramIndex
    from sluice.structured.matcher import GrammarMatcher


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    # Lost its KV blocks to an older request; waits to recompute its prefix.
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Position in the scheduler's arrival order (FCFS, preemption picks the
    # largest); stamped by `Scheduler.add_request`.
    arrival_index: int = -1
    output_token_ids: list[int] = field(default_factory=list)
    # prompt + output, appended in place; built in __post_init__.
    all_token_ids: list[int] = field(init=False)
    # Tokens whose KV is in this request's blocks.
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    # The block table: KV block ids in position order, block i holds
    # positions [i * block_size, (i + 1) * block_size). Owned by KVCacheManager.
    block_ids: list[int] = field(default_factory=list)
    # Hybrid models: its slot in the recurrent-state cache while it runs, else
    # -1. Owned by StateSlotPool (state_slots.py).
    state_slot: int = -1
    # How many of output_token_ids already left in a delta.
    num_emitted_tokens: int = 0
    # Logprob data of the not yet emitted tokens, one entry per token
    # (filled only when params.logprobs is not None).
    pending_logprobs: list[float] = field(default_factory=list)
    pending_top_token_ids: list[tuple[int, ...]] = field(default_factory=list)
    pending_top_logprobs: list[tuple[float, ...]] = field(default_factory=list)
    # The EOS or stop token that finished the request with "stop".
    stop_token_id: int | None = None
    # Prefix caching (KVCacheManager): the chained hash of each full block of
    # all_token_ids computed so far (they depend on the tokens alone, so they
    # outlive a preemption), and how many leading blocks of the table were
    # looked at for naming since the table was (re)built.
    block_hashes: list[bytes] = field(default_factory=list)
    num_named_blocks: int = 0
    # Prompt tokens found in the prefix cache at admission (usage's cached_tokens).
    num_cached_tokens: int = 0
    # With params.prompt_logprobs: those computed so far (from prompt token 1
    # on), which leave whole with the first delta, and whether they left.
    prompt_logprobs: PromptLogprobs = PromptLogprobs((), (), (), ())
    has_sent_prompt_logprobs: bool = False
    # The grammar state of a structured-output request (it has consumed exactly
    # output_token_ids); None for a free one and once the request finished.
    grammar: GrammarMatcher | None = None
    # Engine steps spent waiting (admission or after a preemption), counted
    # under the priority policy only: its aging (sluice/engine/priority.py).
    num_steps_waited: int = 0
    # With speculative decoding: the n-gram index of all_token_ids that
    # proposes its drafts (sluice/engine/speculation.py); built on first use.
    ngram_index: NgramIndex | None = None
    # The length of its next draft (0: not drafted yet), adapted to how much
    # of the last one was accepted (speculation.py `next_draft_length`).
    draft_length: int = 0
    # The running share of its drafted tokens that were accepted (1.0 until
    # it drafts); it drafts only while that pays in a step of its batch's size
    # (speculation.py `Speculator.propose`).
    draft_acceptance: float = 1.0

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, sampled: SampledToken) -> None:
        """Record one sampled token (and its logprobs, if the request asked)."""
        self.output_token_ids.append(sampled.token_id)
        self.all_token_ids.append(sampled.token_id)
        if self.params.logprobs is None:
            return
        assert sampled.logprob is not None, (
            f"request {self.request_id} asked for logprobs but the sampler gave none"
        )
        # The sampler gives exactly this request's top k (logprobs.to_sampled_tokens).
        self.pending_logprobs.append(sampled.logprob)
        self.pending_top_token_ids.append(sampled.top_token_ids)
        self.pending_top_logprobs.append(sampled.top_logprobs)

    def append_prompt_logprobs(self, chunk: PromptLogprobsChunk) -> None:
        """Add one step's prompt logprobs; positions already held (a prefix
        recomputed after preemption) and any after they left are dropped."""
        if self.has_sent_prompt_logprobs:
            return
        num_known = 1 + len(self.prompt_logprobs)  # token 0 has none
        assert chunk.first_token_index <= num_known, "prompt logprobs come in position order"
        skip = num_known - chunk.first_token_index
        new = chunk.logprobs
        self.prompt_logprobs += PromptLogprobs(
            new.logprobs[skip:], new.ranks[skip:], new.top_token_ids[skip:],
            new.top_logprobs[skip:],
        )  # fmt: skip

    def take_delta(self) -> RequestDelta:
        """The tokens since the previous delta (and the finish reason, if any);
        advances the emission cursor so nothing is sent twice."""
        new_token_ids = tuple(self.output_token_ids[self.num_emitted_tokens :])
        self.num_emitted_tokens = self.num_output_tokens
        logprobs = None
        if self.params.logprobs is not None:
            logprobs = TokenLogprobs(
                logprobs=tuple(self.pending_logprobs),
                top_token_ids=tuple(self.pending_top_token_ids),
                top_logprobs=tuple(self.pending_top_logprobs),
            )
            self.pending_logprobs.clear()
            self.pending_top_token_ids.clear()
            self.pending_top_logprobs.clear()
        return RequestDelta(
            request_id=self.request_id,
            new_token_ids=new_token_ids,
            logprobs=logprobs,
            finish_reason=self.status.finish_reason,
            stop_token_id=self.stop_token_id,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
            prompt_logprobs=self._take_prompt_logprobs(),
        )

    def _take_prompt_logprobs(self) -> PromptLogprobs | None:
        if self.params.prompt_logprobs is None or self.has_sent_prompt_logprobs:
            return None
        self.has_sent_prompt_logprobs = True
        return self.prompt_logprobs
