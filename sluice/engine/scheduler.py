"""The scheduler: who computes how many tokens this step, and what came of it.
Pure CPU logic over `Request` counters and the KV block accounting; no model.

A step is `schedule()` → runner → `update(plan, sampled)`:

- `schedule()` spends the token budget on running requests first, oldest
  first (a decode takes 1 token, a request mid-prefill its next chunk), then
  admits waiting requests in arrival order while budget, seats and KV blocks
  allow. Long prompts are chunked across steps, so a step holds the decodes
  and a prefill chunk. A running request short of blocks preempts the newest
  running request (blocks freed, recomputed later) until it fits or is itself
  the newest.
- `update()` advances the counters, appends sampled tokens, applies the stop
  rules, frees the finished and returns one `RequestDelta` per request that
  got a token or finished.

Invariants:
- FCFS without overtaking: every running request arrived before every waiting
  one, both queues are in arrival order, so the newest running request is the
  last of `running` and a preempted one goes back to the front of `waiting`.
- A finished or aborted request is in neither queue and holds no blocks; it is
  never scheduled again and emits exactly one delta with a finish reason.
- `add_request` refuses a request that could never fit the pool or the
  context, so no request waits forever and the oldest one always progresses.

With `scheduling_policy="priority"` (sluice/engine/priority.py), "oldest"
and "arrival order" above read "best rank": each step first ranks both
queues by aged priority and lets waiting requests that outrank running ones
take their seats by preemption (`_apply_priorities`); the FCFS invariant
below is then the rank order at the start of each step.

With a `Speculator` (--speculative-config, sluice/engine/speculation.py), a
decoding request may also verify drafted tokens: its step computes 1 + k
tokens. Drafts come after every running request's own tokens are planned
and allocated, so k is within the budget, max_tokens, the context and the
blocks those leave: a draft is shortened or dropped, and never preempts.
`update` keeps the draft's accepted prefix and one more token, appends them
under the stop rules one by one, sets `num_computed_tokens` to the kept
positions and frees the blocks past them, so the invariants below hold
between steps as without it.

With `enable_chunked_prefill=False` a prompt is only admitted whole. A prompt
longer than the whole budget is then admitted alone, into an otherwise empty
step (after the running requests drain), so that step exceeds the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.config import SchedulerConfig
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.outputs import RequestDelta
from sluice.engine.priority import PriorityOrder
from sluice.engine.request import Request, RequestStatus
from sluice.engine.sampled import PromptLogprobsChunk, SampledToken
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.speculation import Speculator, accepted_tokens
from sluice.engine.state_slots import StateSlotPool

if TYPE_CHECKING:
    from sluice.structured.matcher import GrammarMatcher


@dataclass(slots=True)
class ScheduledRequest:
    """What the runner computes for one request in one step."""

    request_id: str
    # all_token_ids[context_len : context_len + num_new_tokens], a copy.
    token_ids: list[int]
    # Tokens already in the KV cache (num_computed_tokens before this step).
    context_len: int
    num_new_tokens: int
    # KV block ids in position order, a copy: the plan is a value.
    block_table: list[int]
    # True when this step reaches num_tokens: the runner samples one token.
    samples: bool
    # For the sampler. References, not copies: plan and requests live on the
    # engine thread and the runner reads them before `update` appends to them.
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    # The request's grammar state when its output is constrained (the sampler
    # masks with it); a reference, like the lists above.
    grammar: GrammarMatcher | None = None
    # Speculative decoding: tokens proposed after the known ones, the last
    # entries of `token_ids` (counted in num_new_tokens); the runner samples
    # at each of their positions too (sluice/engine/speculation.py).
    draft_token_ids: list[int] = field(default_factory=list)
    # Hybrid models: the request's recurrent-state slot (state_slots.py), and
    # whether its state starts this step (admitted: from zeros at position 0,
    # else from the snapshot at its last cached block); -1 without states.
    state_slot: int = -1
    starts_state: bool = False


@dataclass(slots=True)
class SchedulerPlan:
    # In batch order; `update` expects one SampledToken per `samples` entry.
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    # Sum of num_new_tokens over `scheduled`.
    num_batched_tokens: int = 0
    # Requests that lost their KV blocks this step (to be recomputed later).
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def num_sampling(self) -> int:
        return sum(1 for scheduled in self.scheduled if scheduled.samples)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def decode_rows(self) -> tuple[int, int] | None:
        """(requests, drafted rows) of a step whose every request decodes (one
        token, plus its draft); None for a step with prefill chunks."""
        drafted = 0
        for scheduled in self.scheduled:
            num_draft = len(scheduled.draft_token_ids)
            if scheduled.num_new_tokens != 1 + num_draft or not scheduled.samples:
                return None
            drafted += num_draft
        return len(self.scheduled), drafted


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        speculator: Speculator | None = None,
        states: StateSlotPool | None = None,
    ) -> None:
        self.config = config
        # Hybrid models' recurrent-state slots, one per running request; None: no states.
        self.states = states
        # Proposes drafts for decoding requests; None: speculation off.
        self.speculator = speculator
        self.kv = kv
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        # Live requests (waiting, preempted or running), by id.
        self._requests: dict[str, Request] = {}
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._num_arrived = 0
        # Preemptions since the engine started (vllm:num_preemptions).
        self.num_preemptions = 0
        # The plan `update` must be given next; None between steps.
        self._pending_plan: SchedulerPlan | None = None
        # The priority policy's ranking; None under fcfs.
        self._priorities = None
        if config.scheduling_policy == "priority":
            self._priorities = PriorityOrder(config.priority_aging_steps)

    # -- requests in and out ------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a fresh request. Raises ValueError if it could never run."""
        self.check_admissible(request)
        request.arrival_index = self._num_arrived
        self._num_arrived += 1
        self._requests[request.request_id] = request
        self._waiting.append(request)

    def abort_requests(self, request_ids: Iterable[str]) -> list[RequestDelta]:
        """Finish live requests with "abort" and free their blocks now.
        Unknown or already finished ids are ignored."""
        deltas = []
        for request_id in request_ids:
            request = self._requests.get(request_id)
            if request is None:
                continue
            if request.status is RequestStatus.RUNNING:
                self._running.remove(request)
            else:
                self._waiting.remove(request)
            self._finish(request, RequestStatus.FINISHED_ABORTED)
            deltas.append(request.take_delta())
        return deltas

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def get_request(self, request_id: str) -> Request | None:
        """The live request with this id; None once it finished."""
        return self._requests.get(request_id)

    # -- one step -----------------------------------------------------------

    def schedule(self) -> SchedulerPlan:
        """Choose this step's work. A non-empty plan must go to `update` before
        the next `schedule`; an empty one (nothing live) needs no update."""
        assert self._pending_plan is None, "schedule() called twice without update()"
        plan = SchedulerPlan()
        # 0. Priority policy: rank the queues; outranked running requests yield seats.
        num_yielded = 0 if self._priorities is None else self._apply_priorities(plan)
        # 1. Running requests first, oldest first, preempting the newest if short of blocks.
        self._schedule_running(plan)
        # 2. Admit waiting requests, unless blocks ran short: they would only
        #    take the blocks just freed and be preempted again.
        if len(plan.preempted_ids) == num_yielded:
            self._schedule_waiting(plan)
        # 3. A plan with work must come back through `update`.
        if not plan.is_empty:
            self._pending_plan = plan
        return plan

    def update(
        self,
        plan: SchedulerPlan,
        sampled: list[SampledToken],
        prompt_logprobs: list[PromptLogprobsChunk] | None = None,
        draft_samples: dict[str, list[SampledToken]] | None = None,
    ) -> list[RequestDelta]:
        """Apply one step's results. `sampled` is aligned with the `samples`
        entries of `plan.scheduled`; `prompt_logprobs` holds the prompt logprobs
        computed for the requests that asked; `draft_samples[id]`, for a
        request that verified a draft, the tokens sampled after each drafted one."""
        assert len(sampled) == plan.num_sampling, (
            f"{len(sampled)} tokens, {plan.num_sampling} asked"
        )
        if plan.is_empty:
            return []
        assert plan is self._pending_plan, "update() takes the plan of the latest schedule()"
        self._pending_plan = None
        for chunk in prompt_logprobs or ():
            request = self._requests.get(chunk.request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                request.append_prompt_logprobs(chunk)
        tokens = iter(sampled)
        deltas = []
        for scheduled in plan.scheduled:
            # 1. Pair the request with its token (if it sampled one).
            token = next(tokens) if scheduled.samples else None
            request = self._requests.get(scheduled.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted after schedule(): its final delta is already out
            # 2. Advance it; append the token and apply the stop rules.
            delta = self._advance(request, scheduled, token, draft_samples)
            if delta is not None:
                deltas.append(delta)
        # 3. Finished requests leave the running queue.
        self._running = [request for request in self._running if not request.is_finished]
        return deltas

    # -- schedule() helpers -------------------------------------------------

    def _schedule_running(self, plan: SchedulerPlan) -> None:
        # 1. Each running request's own tokens, oldest first, preempting the newest if short.
        num_preempted = len(plan.preempted_ids)
        index = 0
        while index < len(self._running) and self._budget_left(plan) > 0:
            request = self._running[index]
            assert request.num_uncomputed_tokens > 0, f"{request.request_id} has nothing to do"
            num_new_tokens = min(request.num_uncomputed_tokens, self._budget_left(plan))
            if not self._allocate_or_preempt(request, num_new_tokens, plan):
                break  # it was the newest left: nothing after it remains
            self._add_to_plan(plan, request, num_new_tokens)
            index += 1
        # 2. Drafts, from the budget and blocks those leave; none where blocks ran short.
        if self.speculator is not None and len(plan.preempted_ids) == num_preempted:
            self._schedule_drafts(plan, self.speculator)

    def _schedule_drafts(self, plan: SchedulerPlan, speculator: Speculator) -> None:
        """Give the plan's decoding requests drafts to verify, oldest first. Every
        running request already holds its own token's slot, so a draft only
        takes what is left: it is shortened or dropped, and never preempts."""
        if not speculator.is_on_for(len(self._running)):
            return
        for scheduled in plan.scheduled:
            request = self._requests[scheduled.request_id]
            room = self._draft_room(request, scheduled, plan)
            draft = speculator.propose(request, room, len(self._running)) if room > 0 else []
            if not draft:
                continue
            is_allocated = self.kv.allocate_slots(request, 1 + len(draft))
            assert is_allocated, f"{request.request_id}'s draft outgrew its room"
            scheduled.token_ids.extend(draft)
            scheduled.num_new_tokens += len(draft)
            scheduled.block_table = list(request.block_ids)
            scheduled.draft_token_ids = draft
            plan.num_batched_tokens += len(draft)

    def _draft_room(
        self, request: Request, scheduled: ScheduledRequest, plan: SchedulerPlan
    ) -> int:
        """How many tokens a planned request may draft: none mid-prefill; else
        what the budget, max_tokens, the context and the free blocks leave
        (none can overshoot them)."""
        if scheduled.num_new_tokens != 1 or request.num_uncomputed_tokens != 1:
            return 0
        return min(
            self._budget_left(plan),
            request.params.max_tokens - request.num_output_tokens - 1,
            self.max_model_len - request.num_tokens - 1,
            self.kv.num_allocatable_tokens(request) - 1,
        )

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: SchedulerPlan) -> bool:
        """Get blocks for the request, preempting the newest running requests
        (never one already in the plan: they are older). False if the request
        had to preempt itself."""
        while not self.kv.allocate_slots(request, num_new):
            victim = self._running.pop()
            self._preempt(victim)
            plan.preempted_ids.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        # Its outputs stay in all_token_ids and are recomputed as prefix.
        self.kv.free(request)
        if self.states is not None:
            self.states.free(request)  # recomputed from its tokens (or a snapshot)
        self.num_preemptions += 1
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self._waiting.appendleft(request)  # it is older than every waiting request

    def _apply_priorities(self, plan: SchedulerPlan) -> int:
        """Age and rank both queues; preempt the worst running requests for
        waiting ones that outrank them and lack a seat (the head: or blocks
        for its first chunk). Returns how many were preempted."""
        order = self._priorities
        assert order is not None, "under the priority policy only"
        order.age(self._waiting)
        self._running = order.sorted(self._running)
        num_preempted = 0
        for index, candidate in enumerate(order.sorted(self._waiting)):
            while self._running and order.outranks(candidate, self._running[-1]):
                has_seat = len(self._running) + index < self.config.max_num_seqs
                if has_seat and (index > 0 or self._has_blocks_for(candidate)):
                    break
                victim = self._running.pop()
                self._preempt(victim)
                plan.preempted_ids.append(victim.request_id)
                num_preempted += 1
            else:
                break  # it outranks no running request: nor will those after it
        self._waiting = deque(order.sorted(self._waiting))
        return num_preempted

    def _has_blocks_for(self, request: Request) -> bool:
        """Whether the pool holds `request`'s first chunk, were the running decodes served."""
        budget = max(1, self.config.max_num_batched_tokens - len(self._running))
        return self.kv.can_allocate(request, min(request.num_uncomputed_tokens, budget))

    def _schedule_waiting(self, plan: SchedulerPlan) -> None:
        while (
            self._waiting
            and self._budget_left(plan) > 0
            and len(self._running) < self.config.max_num_seqs
        ):
            request = self._waiting[0]
            # Start at its longest cached prefix (a preempted request's too),
            # unless it needs every prompt position's logits (vLLM does the same).
            num_cached_tokens = 0
            if request.params.prompt_logprobs is None:
                num_cached_tokens = self.kv.take_cached_prefix(request)
            num_new_tokens = self._admission_chunk(request, plan)
            if num_new_tokens == 0 or not self.kv.allocate_slots(request, num_new_tokens):
                self.kv.free(request)  # the prefix goes back to the cache
                request.num_computed_tokens = 0
                return  # FCFS: nobody overtakes the head of the queue
            if request.status is RequestStatus.WAITING:
                # A request's first admission only: a preempted one recomputing
                # its own tokens is not a lookup (vLLM keeps those apart too).
                self.kv.record_lookup(request.num_tokens, num_cached_tokens)
                request.num_cached_tokens = num_cached_tokens
            self._waiting.popleft()
            request.status = RequestStatus.RUNNING
            self._running.append(request)
            if self.states is not None:
                self.states.allocate(request)
            self._add_to_plan(plan, request, num_new_tokens)
            plan.scheduled[-1].starts_state = True

    def _admission_chunk(self, request: Request, plan: SchedulerPlan) -> int:
        """Tokens to compute for a request being admitted; 0 means not now."""
        num_uncomputed = request.num_uncomputed_tokens
        budget_left = self._budget_left(plan)
        if self.config.enable_chunked_prefill or num_uncomputed <= budget_left:
            return min(num_uncomputed, budget_left)
        if num_uncomputed > self.config.max_num_batched_tokens and plan.is_empty:
            return num_uncomputed  # could never fit the budget: runs alone
        return 0

    def _budget_left(self, plan: SchedulerPlan) -> int:
        return self.config.max_num_batched_tokens - plan.num_batched_tokens

    def _add_to_plan(self, plan: SchedulerPlan, request: Request, num_new_tokens: int) -> None:
        start = request.num_computed_tokens
        end = start + num_new_tokens
        plan.scheduled.append(
            ScheduledRequest(
                request_id=request.request_id,
                token_ids=request.all_token_ids[start:end],
                context_len=start,
                num_new_tokens=num_new_tokens,
                block_table=list(request.block_ids),
                samples=end == request.num_tokens,
                params=request.params,
                prompt_token_ids=request.prompt_token_ids,
                output_token_ids=request.output_token_ids,
                grammar=request.grammar,
                state_slot=request.state_slot,
            )
        )
        plan.num_batched_tokens += num_new_tokens

    # -- update() helpers ---------------------------------------------------

    def _advance(
        self,
        request: Request,
        scheduled: ScheduledRequest,
        token: SampledToken | None,
        draft_samples: dict[str, list[SampledToken]] | None = None,
    ) -> RequestDelta | None:
        assert request.num_computed_tokens == scheduled.context_len, (
            f"{request.request_id} changed between schedule() and update()"
        )
        draft = scheduled.draft_token_ids
        num_known = scheduled.num_new_tokens - len(draft)  # scheduled, not drafted
        if token is None:
            request.num_computed_tokens += num_known
            self.kv.cache_full_blocks(request)
            return None  # mid-prefill: no token, no delta
        # 1. The kept tokens: the sampled one, or the accepted draft and one more.
        tokens = [token]
        if draft:
            assert draft_samples is not None and self.speculator is not None, "no verification"
            tokens = accepted_tokens(draft, [token, *draft_samples[request.request_id]])
            self.speculator.record(request, len(draft), len(tokens) - 1)
        # 2. Append them one by one under the stop rules (the first stop ends it).
        num_appended, status = self._append_tokens(request, tokens)
        # 3. The KV cache keeps the known tokens and the drafted ones appended
        #    before the last (whose own KV is computed next step).
        request.num_computed_tokens += num_known + num_appended - 1
        self.kv.cache_full_blocks(request)
        if draft:
            self.kv.free_tail(request, request.num_tokens)
        if status is not None:
            self._finish(request, status)
        return request.take_delta()

    def _append_tokens(
        self, request: Request, tokens: list[SampledToken]
    ) -> tuple[int, RequestStatus | None]:
        """Append tokens until one ends the request: (how many, why it ends)."""
        for num_appended, token in enumerate(tokens, start=1):
            request.append_output_token(token)
            if request.grammar is not None:
                request.grammar.accept(token.token_id)
            status = self._stop_status(request, token.token_id)
            if status is not None:
                return num_appended, status
        return len(tokens), None

    def _stop_status(self, request: Request, token_id: int) -> RequestStatus | None:
        """Why the request ends with this (already appended) token, if it does."""
        params = request.params
        # The sampler masks EOS and stop tokens for the first min_tokens
        # outputs; guard here too, so a sampler bug cannot end one early.
        may_stop = request.num_output_tokens > params.min_tokens
        is_eos = not params.ignore_eos and token_id in self.eos_token_ids
        if may_stop and (is_eos or token_id in params.stop_token_ids):
            request.stop_token_id = token_id
            return RequestStatus.FINISHED_STOPPED
        if request.grammar is not None and request.grammar.is_terminated:
            return RequestStatus.FINISHED_STOPPED  # the output is complete
        if request.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """End a request: free its blocks and forget it. The caller removes it
        from its queue."""
        request.status = status
        self.kv.free(request)
        if self.states is not None:
            self.states.free(request)
        request.grammar = None
        del self._requests[request.request_id]

    def check_admissible(self, request: Request) -> None:
        """Raises ValueError if `add_request` would refuse the request (the
        engine core asks before a structured request waits for its grammar)."""
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already live")
        if request.status is not RequestStatus.WAITING or request.num_output_tokens:
            raise ValueError(f"request {request.request_id!r} is not fresh")
        self._check_fits(request)

    def _check_fits(self, request: Request) -> None:
        num_prompt, max_tokens = request.num_prompt_tokens, request.params.max_tokens
        if num_prompt == 0:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        if num_prompt >= self.max_model_len:
            raise ValueError(f"prompt of {num_prompt} tokens fills max_model_len")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        # Its longest possible sequence; the last token is sampled, never computed.
        final_len = min(num_prompt + max_tokens, self.max_model_len)
        if final_len - 1 > self.kv.capacity_tokens:
            raise ValueError(f"{final_len} tokens can never fit the KV pool")

    def check_consistency(self) -> None:
        """Raise AssertionError if queues, statuses and blocks disagree (for tests)."""
        self.kv.check_consistency(self._requests.values())
        if self.states is not None:
            self.states.check_consistency(self._requests.values())
        live = list(self._running) + list(self._waiting)
        _require(len(live) == len(self._requests), "a live request is in no queue or in two")
        _require(all(r.status is RequestStatus.RUNNING for r in self._running), "bad running")
        for request in self._waiting:
            _require(not request.block_ids, f"waiting {request.request_id} holds blocks")
            _require(request.status is not RequestStatus.RUNNING, "running in waiting")
        if self._priorities is None:  # priority: ranked at the start of each step only
            arrival = [request.arrival_index for request in live]
            _require(arrival == sorted(arrival), "queues out of arrival order")


def _require(condition: bool, message: str) -> None:
    # Not `assert`: tests rely on these checks even under `python -O`.
    if not condition:
        raise AssertionError(message)
