"""The scheduler's drafts against its pool, without a model: every running
request's own next token is allocated before any request's draft, so a draft
is shortened or dropped, never paid for by preempting a running request."""

from __future__ import annotations

import copy
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.config import SchedulerConfig, SpeculativeConfig
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.request import Request
from sluice.engine.sampled import SampledToken
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.scheduler import Scheduler, SchedulerPlan
from sluice.engine.speculation import Speculator

EOS = 2


def speculative(k: int) -> SpeculativeConfig:
    return SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=3)


def make_scheduler(num_blocks: int, block_size: int, k: int, budget: int = 64) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False)
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8), kv, frozenset({EOS}),
        max_model_len=1024, speculator=Speculator(speculative(k)),
    )  # fmt: skip


def periodic_samples(plan: SchedulerPlan, period: int = 4, rng: random.Random | None = None):
    """A fake model whose next token repeats the text `period` back (so n-gram
    drafts are accepted), now and then another (so some are rejected)."""
    sampled, draft_samples = [], {}
    for scheduled in plan.scheduled:
        if not scheduled.samples:
            continue
        known = [*scheduled.prompt_token_ids, *scheduled.output_token_ids]
        draft = scheduled.draft_token_ids
        tokens = []
        for j in range(len(draft) + 1):
            sequence = known + draft[:j]
            is_miss = rng is not None and rng.random() < 0.2
            tokens.append(SampledToken(rng.randrange(10, 99) if is_miss else sequence[-period:][0]))
        sampled.append(tokens[0])
        if draft:
            draft_samples[scheduled.request_id] = tokens[1:]
    return sampled, draft_samples


def step(scheduler: Scheduler, rng: random.Random | None = None) -> SchedulerPlan:
    plan = scheduler.schedule()
    sampled, draft_samples = periodic_samples(plan, rng=rng)
    scheduler.update(plan, sampled, None, draft_samples)
    scheduler.check_consistency()
    return plan


def test_an_older_requests_draft_is_shortened_rather_than_preempting_a_newer_one():
    # Two 8-token prompts of 4-token blocks: the prefill step leaves each at a
    # block boundary, its next token needing a fresh block, and 2 blocks free:
    # one for each request's own token, none for the older one's 4-token draft.
    scheduler = make_scheduler(num_blocks=6, block_size=4, k=8)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    scheduler.add_request(Request("old", [5, 6, 7, 8] * 2, params))
    scheduler.add_request(Request("new", [15, 16, 17, 18] * 2, params))
    step(scheduler)
    assert scheduler.kv.num_free_blocks == 2

    plan = step(scheduler)

    assert plan.preempted_ids == []
    assert scheduler.num_preemptions == 0
    by_id = {scheduled.request_id: scheduled for scheduled in plan.scheduled}
    assert set(by_id) == {"old", "new"}
    # The older request's draft fits what its own fresh block leaves: 3 tokens.
    assert by_id["old"].draft_token_ids == [6, 7, 8]
    assert by_id["new"].draft_token_ids == [16, 17, 18]


def test_drafts_go_to_the_running_decodes_before_the_budget_runs_out():
    # A budget of 5: the older request's 4-token draft must not take the
    # newer one's decode token out of the step.
    scheduler = make_scheduler(num_blocks=64, block_size=4, k=8, budget=5)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    scheduler.add_request(Request("old", [5, 6, 7, 8] * 2, params))
    scheduler.add_request(Request("new", [15], params))
    requests = [scheduler.get_request("old"), scheduler.get_request("new")]
    while any(request.num_uncomputed_tokens != 1 for request in requests):
        step(scheduler)
    assert all(request.num_output_tokens == 1 for request in requests)

    plan = step(scheduler)

    by_id = {scheduled.request_id: scheduled for scheduled in plan.scheduled}
    assert set(by_id) == {"old", "new"}
    assert by_id["old"].draft_token_ids == [6, 7, 8]
    assert plan.num_batched_tokens == 5


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    num_prompts=st.integers(2, 6),
    k=st.integers(1, 8),
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.sampled_from([4, 9, 32, 64]),
)
def test_a_draft_never_causes_a_preemption(seed, num_prompts, k, num_blocks, block_size, budget):
    """Each step preempts exactly the requests the same step would preempt
    with speculation off (a twin of the scheduler, drafts removed)."""
    rng = random.Random(seed)
    scheduler = make_scheduler(num_blocks, block_size, k, budget)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for i in range(num_prompts):
        base = [rng.randrange(10, 99) for _ in range(rng.randrange(2, 6))]
        prompt = (base * 8)[: rng.randrange(len(base), 3 * block_size + 8)]
        request = Request(f"r{i}", prompt, params)
        try:
            scheduler.add_request(request)
        except ValueError:
            continue  # could never fit this pool
    while scheduler.has_unfinished_requests():
        twin = copy.deepcopy(scheduler)
        twin.speculator = None
        plan = scheduler.schedule()
        assert plan.preempted_ids == twin.schedule().preempted_ids
        sampled, draft_samples = periodic_samples(plan, rng=rng)
        scheduler.update(plan, sampled, None, draft_samples)
        scheduler.check_consistency()
