"""Scheduler, driven without a model: hand-built requests and a fake runner
over a simulated paged KV cache.

The fake "greedy model" writes every computed token into the slot its block
table names, and reads the whole sequence back from the slots before
sampling; the next token is a function of that sequence. A wrong block table,
a skipped or repeated position, or a block shared by two live requests makes
the read-back differ from the request's tokens (asserted) and the outputs
diverge from an unpreempted run.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

import pytest

from sluice.config import SchedulerConfig
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.outputs import RequestDelta
from sluice.engine.request import Request, RequestStatus
from sluice.engine.sampled import SampledToken
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.scheduler import ScheduledRequest, Scheduler, SchedulerPlan

EOS = 2
VOCAB = 1000


def greedy_next_token(scheduled: ScheduledRequest, sequence: list[int]) -> int:
    # Never EOS (ids 0..9 are kept for special tokens): runs end by length.
    return 10 + hash(tuple(sequence)) % (VOCAB - 10)


class FakeModel:
    def __init__(
        self,
        kv: KVCacheManager,
        next_token: Callable[[ScheduledRequest, list[int]], int] = greedy_next_token,
    ) -> None:
        self.kv = kv
        self.block_size = kv.block_size_tokens
        self.slots: list[list[int | None]] = [
            [None] * self.block_size for _ in range(kv.num_blocks)
        ]
        self.next_token = next_token

    def execute(self, plan: SchedulerPlan) -> list[SampledToken]:
        sampled = []
        for scheduled in plan.scheduled:
            for offset, token_id in enumerate(scheduled.token_ids):
                self._slot_write(scheduled.block_table, scheduled.context_len + offset, token_id)
            if scheduled.samples:
                sampled.append(self._sample(scheduled))
        return sampled

    def _slot_write(self, block_table: list[int], position: int, token_id: int) -> None:
        block_id = block_table[position // self.block_size]
        # Prefix caching: a block another request holds, or one a later
        # request may find by name, is never written. (Held by none: its
        # request was aborted between schedule() and update().)
        assert self.kv.num_holders(block_id) <= 1, f"block {block_id} written while shared"
        assert not self.kv.is_named(block_id), f"named block {block_id} written"
        self.slots[block_id][position % self.block_size] = token_id

    def _sample(self, scheduled: ScheduledRequest) -> SampledToken:
        length = scheduled.context_len + scheduled.num_new_tokens
        table, size = scheduled.block_table, self.block_size
        sequence = [self.slots[table[p // size]][p % size] for p in range(length)]
        assert sequence == scheduled.prompt_token_ids + scheduled.output_token_ids
        token_id = self.next_token(scheduled, sequence)
        if scheduled.params.logprobs is None:
            return SampledToken(token_id=token_id)
        k = scheduled.params.logprobs  # the sampler gives each request its own top k
        return SampledToken(
            token_id=token_id,
            logprob=-(token_id % 7) / 10,
            top_token_ids=tuple(range(k)),
            top_logprobs=tuple(-float(i) for i in range(k)),
        )


def make_scheduler(
    num_blocks: int = 64,
    block_size_tokens: int = 4,
    max_num_batched_tokens: int = 64,
    max_num_seqs: int = 16,
    enable_chunked_prefill: bool = True,
    max_model_len: int = 256,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        enable_chunked_prefill=enable_chunked_prefill,
    )
    kv = KVCacheManager(num_blocks, block_size_tokens)
    return Scheduler(config, kv, frozenset({EOS}), max_model_len)


def make_request(request_id: str, num_prompt_tokens: int, **params) -> Request:
    rng = random.Random(request_id)  # str seeds are stable across processes
    prompt = [rng.randrange(10, 500) for _ in range(num_prompt_tokens)]
    return Request(request_id, prompt, SamplingParams(**params))


def step(scheduler: Scheduler, model: FakeModel) -> tuple[SchedulerPlan, list[RequestDelta]]:
    plan = scheduler.schedule()
    config = scheduler.config
    assert plan.num_batched_tokens == sum(s.num_new_tokens for s in plan.scheduled)
    if config.enable_chunked_prefill or len(plan.scheduled) > 1:
        assert plan.num_batched_tokens <= config.max_num_batched_tokens
    assert len(plan.scheduled) <= config.max_num_seqs
    assert scheduler.num_running <= config.max_num_seqs
    assert len({s.request_id for s in plan.scheduled}) == len(plan.scheduled)
    check_no_admission_after_preemption(plan)
    deltas = scheduler.update(plan, model.execute(plan))
    scheduler.check_consistency()
    return plan, deltas


def check_no_admission_after_preemption(plan: SchedulerPlan) -> None:
    # Admitting now would only hand the freed blocks to a request that is
    # preempted again next step; admitted requests are those at context 0.
    if plan.preempted_ids:
        assert all(s.context_len > 0 for s in plan.scheduled)


def run_all(scheduler: Scheduler, model: FakeModel) -> dict[str, list[RequestDelta]]:
    streams: dict[str, list[RequestDelta]] = defaultdict(list)
    for _ in range(10_000):
        if not scheduler.has_unfinished_requests():
            return streams
        for delta in step(scheduler, model)[1]:
            streams[delta.request_id].append(delta)
    raise AssertionError("requests did not finish")


def output_of(stream: list[RequestDelta]) -> list[int]:
    return [token_id for delta in stream for token_id in delta.new_token_ids]


# -- budget, seats, chunked prefill ------------------------------------------


def test_every_step_respects_the_token_budget_and_the_seat_cap():
    scheduler = make_scheduler(num_blocks=200, max_num_batched_tokens=48, max_num_seqs=6)
    model = FakeModel(scheduler.kv)
    for i in range(30):
        scheduler.add_request(make_request(f"r{i}", 1 + (i * 37) % 90, max_tokens=1 + i % 9))
    seen_full_budget = seen_full_seats = False
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, model)  # asserts budget and seats every step
        seen_full_budget |= plan.num_batched_tokens == 48
        seen_full_seats |= scheduler.num_running == 6
    assert seen_full_budget and seen_full_seats


def test_a_long_prompt_is_chunked_while_running_requests_decode_every_step():
    scheduler = make_scheduler(
        num_blocks=400, block_size_tokens=16, max_num_batched_tokens=512, max_model_len=4096
    )
    model = FakeModel(scheduler.kv)
    for i in range(8):
        scheduler.add_request(make_request(f"d{i}", 20, max_tokens=200))
    step(scheduler, model)  # all eight prefill and sample their first token
    scheduler.add_request(make_request("long", 3000, max_tokens=5))
    chunk_sizes = []
    while scheduler.get_request("long").num_output_tokens == 0:
        plan, deltas = step(scheduler, model)
        decodes = [s for s in plan.scheduled if s.request_id != "long"]
        assert [(s.num_new_tokens, s.samples) for s in decodes] == [(1, True)] * 8
        assert sorted(d.request_id for d in deltas if d.request_id != "long") == sorted(
            f"d{i}" for i in range(8)
        )
        (prefill,) = [s for s in plan.scheduled if s.request_id == "long"]
        assert prefill.context_len == sum(chunk_sizes)
        chunk_sizes.append(prefill.num_new_tokens)
    assert sum(chunk_sizes) == 3000
    assert len(chunk_sizes) == 6  # ceil(3000 / (512 - 8))
    assert chunk_sizes[:-1] == [504] * 5


def test_a_request_mid_prefill_emits_no_delta():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    model = FakeModel(scheduler.kv)
    scheduler.add_request(make_request("r", 20, max_tokens=2))
    assert [step(scheduler, model)[1] for _ in range(2)] == [[], []]
    plan, deltas = step(scheduler, model)
    assert plan.scheduled[0].samples
    assert [d.new_token_ids for d in deltas] == [(deltas[0].new_token_ids[0],)]


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_the_budget_whole():
    scheduler = make_scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    model = FakeModel(scheduler.kv)
    scheduler.add_request(make_request("a", 10, max_tokens=3))
    scheduler.add_request(make_request("b", 10, max_tokens=3))
    plan, _ = step(scheduler, model)
    assert [(s.request_id, s.num_new_tokens) for s in plan.scheduled] == [("a", 10)]
    plan, _ = step(scheduler, model)
    assert [(s.request_id, s.num_new_tokens) for s in plan.scheduled] == [("a", 1), ("b", 10)]


def test_without_chunked_prefill_a_prompt_beyond_the_budget_runs_alone():
    scheduler = make_scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    model = FakeModel(scheduler.kv)
    scheduler.add_request(make_request("short", 4, max_tokens=2))
    scheduler.add_request(make_request("long", 40, max_tokens=2))
    plans = [step(scheduler, model)[0] for _ in range(4)]
    assert [[(s.request_id, s.num_new_tokens) for s in p.scheduled] for p in plans] == [
        [("short", 4)],
        [("short", 1)],
        [("long", 40)],
        [("long", 1)],
    ]


# -- preemption --------------------------------------------------------------


def test_a_short_pool_preempts_the_newest_request_and_resumes_it_later():
    scheduler = make_scheduler(num_blocks=12, block_size_tokens=4)
    model = FakeModel(scheduler.kv)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", 9, max_tokens=12))
    first_preempted = None
    while scheduler.has_unfinished_requests() and first_preempted is None:
        running_before = sorted(
            (r.arrival_index, r.request_id)
            for r in map(scheduler.get_request, ["r0", "r1", "r2", "r3"])
            if r is not None and r.status is RequestStatus.RUNNING
        )
        plan, _ = step(scheduler, model)
        if plan.preempted_ids:
            first_preempted = plan.preempted_ids[0]
            assert first_preempted == running_before[-1][1]
    victim = scheduler.get_request(first_preempted)
    assert victim.status is RequestStatus.PREEMPTED
    assert victim.block_ids == [] and victim.num_computed_tokens == 0
    streams = run_all(scheduler, model)
    assert streams[first_preempted][-1].finish_reason == "length"


def test_preempted_requests_produce_the_same_outputs_as_an_unpreempted_run():
    def outputs(num_blocks: int) -> tuple[dict[str, list[int]], int]:
        scheduler = make_scheduler(num_blocks=num_blocks, block_size_tokens=4)
        model = FakeModel(scheduler.kv)
        for i in range(10):
            scheduler.add_request(make_request(f"r{i}", 5 + 7 * i, max_tokens=30 - 2 * i))
        num_preempted = 0
        streams: dict[str, list[RequestDelta]] = defaultdict(list)
        while scheduler.has_unfinished_requests():
            plan, deltas = step(scheduler, model)
            num_preempted += len(plan.preempted_ids)
            for delta in deltas:
                streams[delta.request_id].append(delta)
        return {rid: output_of(stream) for rid, stream in streams.items()}, num_preempted

    small, num_preempted_small = outputs(num_blocks=25)
    big, num_preempted_big = outputs(num_blocks=1000)
    assert num_preempted_big == 0 and num_preempted_small > 5
    assert small == big


def test_a_request_waiting_for_blocks_counts_its_prefix_lookup_once_when_admitted():
    scheduler = make_scheduler(num_blocks=6, block_size_tokens=4, max_model_len=64)
    model = FakeModel(scheduler.kv)
    shared = make_request("shared", 8).prompt_token_ids  # 2 full blocks
    scheduler.add_request(Request("a", [*shared, *range(11, 16)], SamplingParams(max_tokens=8)))
    step(scheduler, model)  # a holds 4 of the 6 blocks, its first 2 named
    b_prompt = [*shared, *range(21, 33)]  # 5 blocks: 2 found, 3 more than are free
    scheduler.add_request(Request("b", b_prompt, SamplingParams(max_tokens=4)))
    num_steps_waiting = 0
    while scheduler.get_request("b").status is RequestStatus.WAITING:
        step(scheduler, model)  # b finds 8 tokens but lacks blocks for the rest
        num_steps_waiting += 1
    assert num_steps_waiting >= 2
    assert scheduler.kv.num_queried_tokens == 13 + 20
    assert scheduler.kv.num_hit_tokens == 8
    assert scheduler.get_request("b").num_cached_tokens == 8


def test_requests_sharing_a_prefix_keep_their_outputs_when_one_is_preempted():
    """B shares A's first blocks; the pool is short, so B is preempted (its hold
    on the shared blocks dropped, A's kept) and comes back starting from them."""
    shared = make_request("shared", 16).prompt_token_ids  # 4 full blocks of 4

    def outputs(num_blocks: int) -> tuple[dict[str, list[int]], int, tuple[int, int]]:
        scheduler = make_scheduler(num_blocks=num_blocks, block_size_tokens=4)
        model = FakeModel(scheduler.kv)
        streams: dict[str, list[RequestDelta]] = defaultdict(list)
        scheduler.add_request(Request("a", [*shared, 11, 12, 13], SamplingParams(max_tokens=24)))
        step(scheduler, model)  # a's prompt computed: its full blocks are named
        scheduler.add_request(Request("b", [*shared, 21, 22], SamplingParams(max_tokens=24)))
        num_preempted = 0
        while scheduler.has_unfinished_requests():
            plan, deltas = step(scheduler, model)  # checks the pool after every step
            num_preempted += len(plan.preempted_ids)
            for delta in deltas:
                streams[delta.request_id].append(delta)
        outputs = {rid: output_of(stream) for rid, stream in streams.items()}
        lookups = (scheduler.kv.num_queried_tokens, scheduler.kv.num_hit_tokens)
        return outputs, num_preempted, lookups

    small, num_preempted, lookups = outputs(num_blocks=13)
    big, num_preempted_big, lookups_big = outputs(num_blocks=1000)
    assert num_preempted_big == 0 and num_preempted >= 1
    assert small == big
    # b started from a's 16 tokens; its recomputation after preemption is not a
    # lookup of the prefix cache metrics (vLLM counts a request's first one only).
    assert lookups == lookups_big == (19 + 18, 16)


# -- aborts ------------------------------------------------------------------


def scheduler_with_request_in(state: str) -> tuple[Scheduler, FakeModel]:
    """A scheduler whose request "t" is in `state`, next to another one."""
    if state == "waiting":
        scheduler = make_scheduler(max_num_seqs=1)
    elif state == "mid_prefill":
        scheduler = make_scheduler(max_num_batched_tokens=12)
    else:  # decoding, preempted: 4 blocks of 4 slots for two requests
        scheduler = make_scheduler(num_blocks=4, block_size_tokens=4)
    model = FakeModel(scheduler.kv)
    scheduler.add_request(make_request("other", 7, max_tokens=8))
    scheduler.add_request(make_request("t", 7 if state != "mid_prefill" else 30, max_tokens=8))
    for _ in range({"waiting": 1, "mid_prefill": 1, "decoding": 2, "preempted": 3}[state]):
        step(scheduler, model)
    return scheduler, model


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("waiting", RequestStatus.WAITING),
        ("mid_prefill", RequestStatus.RUNNING),
        ("decoding", RequestStatus.RUNNING),
        ("preempted", RequestStatus.PREEMPTED),
    ],
)
def test_abort_frees_every_block_whatever_the_request_state(state, status):
    scheduler, model = scheduler_with_request_in(state)
    target = scheduler.get_request("t")
    assert target.status is status
    assert (state == "mid_prefill") == (0 < target.num_computed_tokens < target.num_prompt_tokens)
    other_blocks = len(scheduler.get_request("other").block_ids)
    (delta,) = scheduler.abort_requests(["t"])
    assert (delta.request_id, delta.new_token_ids, delta.finish_reason) == ("t", (), "abort")
    assert target.block_ids == [] and target.status is RequestStatus.FINISHED_ABORTED
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks - other_blocks
    scheduler.check_consistency()
    streams = run_all(scheduler, model)
    assert "t" not in streams
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks


def test_unknown_and_finished_ids_are_ignored_by_abort():
    scheduler = make_scheduler()
    model = FakeModel(scheduler.kv)
    scheduler.add_request(make_request("r", 4, max_tokens=1))
    run_all(scheduler, model)
    assert scheduler.abort_requests(["r", "nobody", "r"]) == []


def test_an_abort_between_schedule_and_update_is_emitted_once_and_never_scheduled_again():
    scheduler = make_scheduler()
    model = FakeModel(scheduler.kv)
    scheduler.add_request(make_request("a", 4, max_tokens=5, logprobs=1))
    scheduler.add_request(make_request("b", 4, max_tokens=5))
    step(scheduler, model)
    plan = scheduler.schedule()
    (abort_delta,) = scheduler.abort_requests(["a"])
    assert abort_delta.logprobs is not None and abort_delta.logprobs.logprobs == ()
    deltas = scheduler.update(plan, model.execute(plan))
    assert [d.request_id for d in deltas] == ["b"]
    scheduler.check_consistency()
    later_plan = scheduler.schedule()
    assert [s.request_id for s in later_plan.scheduled] == ["b"]


def test_an_idle_scheduler_gives_empty_plans_that_need_no_update():
    scheduler = make_scheduler()
    model = FakeModel(scheduler.kv)
    scheduler.add_request(make_request("r", 4, max_tokens=3))
    scheduler.abort_requests(["r"])
    assert scheduler.schedule().is_empty
    assert scheduler.schedule().is_empty  # the engine core skips update() for these
    scheduler.add_request(make_request("s", 4, max_tokens=3))
    step(scheduler, model)
    with pytest.raises(AssertionError, match="without update"):
        scheduler.schedule()
        scheduler.schedule()


# -- stop conditions and logprobs ----------------------------------------------


def scripted(tokens: list[int]) -> Callable[[ScheduledRequest, list[int]], int]:
    """A model that answers `tokens` in order, whatever the prompt."""
    return lambda scheduled, sequence: tokens[len(scheduled.output_token_ids)]


def run_scripted(
    tokens: list[int], max_model_len: int = 256, num_prompt_tokens: int = 4, **params
) -> list[RequestDelta]:
    scheduler = make_scheduler(max_model_len=max_model_len)
    model = FakeModel(scheduler.kv, next_token=scripted(tokens))
    scheduler.add_request(make_request("r", num_prompt_tokens, **params))
    stream = run_all(scheduler, model)["r"]
    assert [d.finish_reason is not None for d in stream] == [False] * (len(stream) - 1) + [True]
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks
    return stream


@pytest.mark.parametrize(
    ("params", "output", "finish_reason", "stop_token_id"),
    [
        ({}, [11, 12, EOS], "stop", EOS),
        ({"ignore_eos": True}, [11, 12, EOS, 13, EOS, 12], "length", None),
        ({"stop_token_ids": (12,)}, [11, 12], "stop", 12),
        ({"ignore_eos": True, "stop_token_ids": (EOS,)}, [11, 12, EOS], "stop", EOS),
        ({"max_tokens": 2}, [11, 12], "length", None),
        ({"min_tokens": 3}, [11, 12, EOS, 13, EOS], "stop", EOS),
        ({"min_tokens": 2}, [11, 12, EOS], "stop", EOS),
        (  # a stop token outranks max_tokens
            {"min_tokens": 4, "stop_token_ids": (12,), "ignore_eos": True},
            [11, 12, EOS, 13, EOS, 12],
            "stop",
            12,
        ),
    ],
)
def test_stop_rules(params, output, finish_reason, stop_token_id):
    params = {"max_tokens": 6, **params}
    stream = run_scripted([11, 12, EOS, 13, EOS, 12, 14, 15], **params)
    assert output_of(stream) == output
    assert (stream[-1].finish_reason, stream[-1].stop_token_id) == (finish_reason, stop_token_id)


def test_a_request_stops_with_length_at_the_context_limit():
    stream = run_scripted(list(range(20, 40)), max_model_len=10, num_prompt_tokens=7, max_tokens=9)
    assert output_of(stream) == [20, 21, 22]  # 7 + 3 tokens reach max_model_len
    assert stream[-1].finish_reason == "length"


def test_each_delta_carries_one_logprob_entry_per_token_with_its_top_k():
    stream = run_scripted([11, 12, 13], max_tokens=3, logprobs=3)
    for delta in stream:
        logprobs = delta.logprobs
        assert len(logprobs.logprobs) == len(delta.new_token_ids) == 1
        assert logprobs.top_token_ids == ((0, 1, 2),)
        assert logprobs.logprobs[0] == -(delta.new_token_ids[0] % 7) / 10
    assert all(d.logprobs is None for d in run_scripted([11, 12], max_tokens=2))


# -- admission guard -----------------------------------------------------------


@pytest.mark.parametrize(
    ("num_prompt_tokens", "max_tokens", "match"),
    [
        (0, 4, "empty"),
        (32, 4, "fills max_model_len"),
        (10, 0, "max_tokens"),
        (20, 4, "KV pool"),  # 23 tokens to compute, 16 slots
    ],
)
def test_a_request_that_could_never_run_is_refused(num_prompt_tokens, max_tokens, match):
    scheduler = make_scheduler(num_blocks=4, block_size_tokens=4, max_model_len=32)
    request = make_request("r", num_prompt_tokens, max_tokens=max_tokens)
    with pytest.raises(ValueError, match=match):
        scheduler.add_request(request)
    assert not scheduler.has_unfinished_requests()


def test_a_live_request_id_cannot_be_added_twice():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r", 4))
    with pytest.raises(ValueError, match="already live"):
        scheduler.add_request(make_request("r", 4))


# -- many random requests --------------------------------------------------------


def test_a_thousand_random_requests_with_aborts_and_preemption_all_end_exactly_once():
    rng = random.Random(20250101)
    scheduler = make_scheduler(
        num_blocks=48, block_size_tokens=4, max_num_batched_tokens=64, max_model_len=128
    )
    model = FakeModel(scheduler.kv, next_token=lambda s, seq: hash(tuple(seq)) % 200)
    requests: list[Request] = []
    streams: dict[str, list[RequestDelta]] = defaultdict(list)
    num_preempted = 0

    def collect(deltas: list[RequestDelta]) -> None:
        for delta in deltas:
            stream = streams[delta.request_id]
            assert not (stream and stream[-1].is_finished), f"{delta.request_id} after finish"
            stream.append(delta)

    def abort_random(probability: float) -> None:
        if requests and rng.random() < probability:
            collect(scheduler.abort_requests([rng.choice(requests).request_id, "unknown"]))

    while len(requests) < 1000 or scheduler.has_unfinished_requests():
        for _ in range(rng.randint(0, 3) if len(requests) < 1000 else 0):
            requests.append(random_request(rng, f"r{len(requests)}"))
            scheduler.add_request(requests[-1])
        abort_random(0.3)
        plan = scheduler.schedule()
        assert plan.num_batched_tokens <= 64 and len(plan.scheduled) <= 16
        assert all(scheduler.get_request(s.request_id) is not None for s in plan.scheduled)
        num_preempted += len(plan.preempted_ids)
        check_no_admission_after_preemption(plan)
        abort_random(0.05)  # between schedule() and update()
        collect(scheduler.update(plan, model.execute(plan)))
        scheduler.check_consistency()

    assert num_preempted > 50
    finish_reasons = defaultdict(int)
    for request in requests:
        stream = streams[request.request_id]
        assert [d.is_finished for d in stream] == [False] * (len(stream) - 1) + [True]
        assert output_of(stream) == request.output_token_ids
        assert all(d.num_prompt_tokens == request.num_prompt_tokens for d in stream)
        if request.params.logprobs is not None:
            assert all(len(d.logprobs.logprobs) == len(d.new_token_ids) for d in stream)
        finish_reasons[stream[-1].finish_reason] += 1
    assert min(finish_reasons[reason] for reason in ("stop", "length", "abort")) > 10
    # Shared prefixes were found, and counted once per request (not again on
    # the return of a preempted one).
    assert scheduler.kv.num_hit_tokens > 500, "shared prefixes were found in the cache"
    assert scheduler.kv.num_hit_tokens == sum(r.num_cached_tokens for r in requests)
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks
    scheduler.kv.check_consistency([])


def random_request(rng: random.Random, request_id: str) -> Request:
    params = SamplingParams(
        max_tokens=rng.randint(1, 40),
        stop_token_ids=(rng.randrange(200),) if rng.random() < 0.2 else (),
        logprobs=rng.choice([None, None, 0, 2]),
    )
    # Half the prompts start with one of a few shared prefixes (a system
    # prompt, an earlier turn), of lengths on and off the block boundaries.
    prefix = rng.choice(SHARED_PREFIXES) if rng.random() < 0.5 else []
    prompt = prefix + [rng.randrange(10, 200) for _ in range(rng.randint(1, 80 - len(prefix)))]
    return Request(request_id, prompt, params)


_PREFIX_RNG = random.Random(7)
SHARED_PREFIXES = [[_PREFIX_RNG.randrange(10, 200) for _ in range(n)] for n in (3, 4, 8, 13, 30)]
