"""Priority scheduling on the scheduler alone (no model): a high-priority
request behind 64 low-priority ones gets its first token in the next step,
the aging bound holds (and without aging the low one starves), fcfs ignores
priorities, and preempted streams are exactly what an unpreempted run gives."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from sluice.config import SchedulerConfig
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.outputs import RequestDelta
from sluice.engine.priority import PriorityOrder
from sluice.engine.request import Request
from sluice.engine.sampled import SampledToken
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.scheduler import Scheduler, SchedulerPlan

BLOCK_SIZE = 4


class KVModel:
    """Writes each step's tokens into its KV slots and samples from what the
    slots hold, so a wrong block table or a lost token changes the output."""

    def __init__(self, kv: KVCacheManager):
        self.slots = [[None] * BLOCK_SIZE for _ in range(kv.num_blocks)]

    def execute(self, plan: SchedulerPlan) -> list[SampledToken]:
        sampled = []
        for scheduled in plan.scheduled:
            table = scheduled.block_table
            for offset, token_id in enumerate(scheduled.token_ids):
                position = scheduled.context_len + offset
                self.slots[table[position // BLOCK_SIZE]][position % BLOCK_SIZE] = token_id
            if scheduled.samples:
                length = scheduled.context_len + scheduled.num_new_tokens
                sequence = [self.slots[table[p // BLOCK_SIZE]][p % BLOCK_SIZE]
                            for p in range(length)]  # fmt: skip
                assert sequence == scheduled.prompt_token_ids + scheduled.output_token_ids
                sampled.append(SampledToken(token_id=10 + hash(tuple(sequence)) % 990))
        return sampled


def make(policy: str = "priority", *, num_blocks: int = 1024, max_num_seqs: int = 64,
         aging_steps: int = 500, budget: int = 512) -> tuple[Scheduler, KVModel]:  # fmt: skip
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        scheduling_policy=policy,
        priority_aging_steps=aging_steps,
    )
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=False)
    return Scheduler(config, kv, frozenset({2}), 4096), KVModel(kv)


def request(request_id: str, priority: int = 0, num_prompt: int = 8, max_tokens: int = 64):
    rng = random.Random(request_id)
    prompt = [rng.randrange(10, 500) for _ in range(num_prompt)]
    params = SamplingParams(max_tokens=max_tokens, priority=priority, ignore_eos=True)
    return Request(request_id, prompt, params)


def step(scheduler: Scheduler, model: KVModel) -> tuple[SchedulerPlan, list[RequestDelta]]:
    plan = scheduler.schedule()
    assert len(plan.scheduled) <= scheduler.config.max_num_seqs
    assert plan.num_batched_tokens <= scheduler.config.max_num_batched_tokens
    deltas = scheduler.update(plan, model.execute(plan))
    scheduler.check_consistency()
    return plan, deltas


def first_token_step(policy: str) -> int:
    """Steps from a chat request's arrival to its first token, behind 64 running batch ones."""
    scheduler, model = make(policy)
    for i in range(64):
        scheduler.add_request(request(f"batch-{i}", priority=0, max_tokens=200))
    for _ in range(3):  # the batch runs: every seat taken
        step(scheduler, model)
    assert scheduler.num_running == 64
    scheduler.add_request(request("chat", priority=-1, num_prompt=20))
    for num_steps in range(1, 1000):
        _, deltas = step(scheduler, model)
        if any(d.request_id == "chat" and d.new_token_ids for d in deltas):
            return num_steps
    raise AssertionError("the chat request never got a token")


def test_a_high_priority_request_behind_64_gets_its_first_token_in_the_next_step():
    assert first_token_step("priority") == 1
    # Under fcfs it waits for a seat: until the first batch request finishes.
    assert first_token_step("fcfs") > 150


def test_the_preempted_request_resumes_and_every_stream_is_exact():
    def outputs(policy: str, num_blocks: int) -> tuple[dict[str, list[int]], int]:
        scheduler, model = make(policy, num_blocks=num_blocks, max_num_seqs=6, budget=48)
        rng = random.Random(7)
        streams: dict[str, list[int]] = defaultdict(list)
        finished: set[str] = set()
        for index in range(40):
            priority, length = rng.choice([-2, -1, 0, 3]), rng.randrange(3, 30)
            scheduler.add_request(request(f"r{index}", priority, length, rng.randrange(1, 24)))
            for _ in range(rng.randrange(0, 3)):
                for delta in (
                    step(scheduler, model)[1] if scheduler.has_unfinished_requests() else []
                ):
                    streams[delta.request_id] += delta.new_token_ids
                    if delta.finish_reason is not None:
                        finished.add(delta.request_id)
        while scheduler.has_unfinished_requests():
            for delta in step(scheduler, model)[1]:
                streams[delta.request_id] += delta.new_token_ids
                if delta.finish_reason is not None:
                    finished.add(delta.request_id)
        assert finished == {f"r{i}" for i in range(40)}
        return dict(streams), scheduler.num_preemptions

    exact, _ = outputs("fcfs", num_blocks=4096)
    ranked, num_preemptions = outputs("priority", num_blocks=40)
    assert num_preemptions > 0
    assert ranked == exact


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    scheduler, model = make(max_num_seqs=1)
    scheduler.add_request(request("running", priority=-5, max_tokens=2))
    step(scheduler, model)
    for name, priority in [("a", 1), ("b", 0), ("c", 1), ("d", 0)]:
        scheduler.add_request(request(name, priority, max_tokens=1))
    admitted = []
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, model)
        admitted += [s.request_id for s in plan.scheduled if s.context_len == 0]
    assert admitted == ["b", "d", "a", "c"]


def test_fcfs_ignores_priorities():
    scheduler, model = make("fcfs", max_num_seqs=1)
    for name, priority in [("a", 5), ("b", -5), ("c", 0)]:
        scheduler.add_request(request(name, priority, max_tokens=1))
    admitted = []
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, model)
        admitted += [s.request_id for s in plan.scheduled if s.context_len == 0]
    assert admitted == ["a", "b", "c"]


def overtakers(aging_steps: int, num_steps: int = 200) -> tuple[list[int], int | None]:
    """A priority-2 request among priority-0 arrivals, one per step, on one seat:
    when each request admitted before it arrived (steps after it), and when it was admitted."""
    scheduler, model = make(max_num_seqs=1, aging_steps=aging_steps)
    scheduler.add_request(request("head", priority=0, max_tokens=2))
    step(scheduler, model)
    scheduler.add_request(request("low", priority=2, max_tokens=2))
    arrival_step: dict[str, int] = {}
    overtaken_by: list[int] = []
    for now in range(num_steps):
        name = f"p0-{now}"
        arrival_step[name] = now
        scheduler.add_request(request(name, priority=0, max_tokens=2))
        plan, _ = step(scheduler, model)
        for scheduled in plan.scheduled:
            if scheduled.context_len != 0:
                continue
            if scheduled.request_id == "low":
                return overtaken_by, now
            overtaken_by.append(arrival_step[scheduled.request_id])
    return overtaken_by, None


def test_aging_bounds_the_wait_of_a_low_priority_request():
    aging_steps = 4
    overtaken_by, admitted_at = overtakers(aging_steps)
    assert admitted_at is not None
    # The documented bound: once it waited aging_steps * (2 - 0) steps, no
    # request arriving later is admitted before it.
    bound = aging_steps * (2 - 0)
    assert overtaken_by and max(overtaken_by) < bound
    # Without aging to speak of, the same traffic starves it.
    assert overtakers(aging_steps=10_000)[1] is None


def test_aging_counts_only_steps_spent_waiting():
    order = PriorityOrder(aging_steps=3)
    waiting, running = request("w", priority=1), request("r", priority=1)
    waiting.arrival_index, running.arrival_index = 1, 0
    for _ in range(3):
        order.age([waiting])
    assert order.rank(waiting) == (0, 1) and order.rank(running) == (1, 0)
    assert order.outranks(waiting, running)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_an_abort_of_a_ranked_request_frees_everything(policy):
    scheduler, model = make(policy, max_num_seqs=2)
    for name, priority in [("a", 1), ("b", 0), ("c", -1)]:
        scheduler.add_request(request(name, priority))
    step(scheduler, model)
    deltas = scheduler.abort_requests(["a", "b", "c"])
    assert {d.finish_reason for d in deltas} == {"abort"}
    assert not scheduler.has_unfinished_requests()
    scheduler.check_consistency()
