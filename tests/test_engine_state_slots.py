"""The recurrent-state slots of hybrid models (engine/state_slots.py), alone
and as the scheduler hands them out: one per running request, taken at
admission (where the state starts), given back at preemption, finish and
abort. No model: a fake runner that checks every slot it is given."""

from __future__ import annotations

import pytest

from sluice.config import SchedulerConfig
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.request import Request
from sluice.engine.sampled import SampledToken
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.scheduler import Scheduler, SchedulerPlan
from sluice.engine.state_slots import NO_SLOT, StateSlotPool

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def request(index: int, length: int = 10) -> Request:
    return Request(f"r{index}", list(range(3, 3 + length)), PARAMS)


def test_a_slot_goes_to_one_request_and_comes_back_once():
    pool = StateSlotPool(2)
    first, second = request(0), request(1)
    pool.allocate(first)
    pool.allocate(second)
    assert {first.state_slot, second.state_slot} == {0, 1}
    assert pool.num_free_slots == 0
    pool.free(first)
    pool.free(first)  # idempotent
    assert first.state_slot == NO_SLOT and pool.num_free_slots == 1
    pool.check_consistency([first, second])


def test_a_request_holding_a_slot_cannot_take_another():
    pool = StateSlotPool(2)
    held = request(0)
    pool.allocate(held)
    with pytest.raises(AssertionError, match="already holds a slot"):
        pool.allocate(held)


def test_consistency_catches_a_slot_held_twice():
    pool = StateSlotPool(2)
    first, second = request(0), request(1)
    pool.allocate(first)
    second.state_slot = first.state_slot
    with pytest.raises(AssertionError, match="held twice"):
        pool.check_consistency([first, second])


def test_an_empty_pool_is_refused():
    with pytest.raises(ValueError, match="num_slots > 0"):
        StateSlotPool(0)


class SlotCheckingRunner:
    """Samples a fixed token; asserts that live slots are distinct and that a
    request's state starts exactly on its admission steps."""

    def __init__(self) -> None:
        self.admissions: dict[str, int] = {}

    def execute(self, plan: SchedulerPlan) -> list[SampledToken]:
        slots = [s.state_slot for s in plan.scheduled]
        assert NO_SLOT not in slots and len(set(slots)) == len(slots)
        for s in plan.scheduled:
            if s.starts_state:
                self.admissions[s.request_id] = self.admissions.get(s.request_id, 0) + 1
        return [SampledToken(token_id=7) for s in plan.scheduled if s.samples]


def drive(scheduler: Scheduler, runner: SlotCheckingRunner, num_steps: int = 200) -> None:
    for _ in range(num_steps):
        plan = scheduler.schedule()
        if plan.is_empty:
            return
        scheduler.update(plan, runner.execute(plan))
        scheduler.check_consistency()


def test_the_scheduler_gives_each_running_request_a_slot_and_takes_it_back():
    states = StateSlotPool(3)
    kv = KVCacheManager(64, 4)
    config = SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=3)
    scheduler = Scheduler(config, kv, frozenset({2}), 64, states=states)
    for index in range(5):
        scheduler.add_request(request(index))
    runner = SlotCheckingRunner()
    drive(scheduler, runner)
    assert not scheduler.has_unfinished_requests()
    assert states.num_free_slots == 3
    assert runner.admissions == {f"r{i}": 1 for i in range(5)}  # chunks after the first continue


def test_preemption_and_abort_give_the_slot_back_and_a_resume_starts_again():
    states = StateSlotPool(4)
    kv = KVCacheManager(9, 4, enable_prefix_caching=False)  # 36 slots: room for 2 requests
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4)
    scheduler = Scheduler(config, kv, frozenset({2}), 64, states=states)
    for index in range(4):
        scheduler.add_request(request(index, length=12))
    runner = SlotCheckingRunner()
    plan = scheduler.schedule()
    scheduler.update(plan, runner.execute(plan))
    scheduler.abort_requests(["r0"])
    scheduler.check_consistency()
    drive(scheduler, runner)
    assert scheduler.num_preemptions > 0
    assert states.num_free_slots == 4
    assert any(count > 1 for count in runner.admissions.values())  # resumed: started again
