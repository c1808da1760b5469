"""When a step speculates (sluice/engine/speculation.py `Speculator.is_on_for`):
from the step times measured at load (the kernel plan's int8 matmul seconds
per row count), injected here, so no test depends on this machine's speed.

- a memory-bound curve (few rows cost about one row: AVX512-VNNI decode)
  speculates at small batches and stops where rows start to cost their
  share (compute-bound);
- an explicit `disable_by_batch_size` wins over the measurement; with no
  measurement every step speculates;
- `seconds_at` interpolates between measured points and grows with rows
  beyond the last;
- which requests draft: the engine's own step times (injected) price a
  drafted row; a request whose drafts are accepted too rarely to pay for
  their rows stops drafting in such steps, then tries again; only steps of
  decodes are measured.
"""

from __future__ import annotations

import pytest

from sluice.config import SpeculativeConfig
from sluice.engine.speculation import Speculator, pays_off, seconds_at

# (rows, seconds) as the AMX machine gave them for the embedded model's gate/up
# (VNNI to 4 rows, AMX from 8): memory-bound to ~16 rows, compute-bound beyond.
AMX = ((1, 55e-6), (2, 57e-6), (4, 60e-6), (8, 62e-6), (16, 70e-6), (32, 95e-6),
       (64, 150e-6), (512, 1.1e-3))  # fmt: skip
# A CPU where every row costs its share from the start (no gain anywhere).
COMPUTE_BOUND = tuple((n, n * 1e-5) for n in (1, 2, 4, 8, 16, 32, 64, 512))


def test_seconds_at_interpolates_and_extrapolates():
    assert seconds_at(AMX, 1) == 55e-6
    assert seconds_at(AMX, 3) == pytest.approx(58.5e-6)
    assert seconds_at(AMX, 1024) == pytest.approx(2.2e-3)
    assert seconds_at(((4, 1.0),), 2) == 1.0  # below the first point: the first


def test_small_batches_speculate_and_compute_bound_ones_do_not():
    k = 4
    on = [batch for batch in (1, 2, 4, 8, 16, 32, 64, 128) if pays_off(AMX, batch, k)]
    assert on == [1, 2, 4, 8]
    assert not any(pays_off(COMPUTE_BOUND, batch, k) for batch in (1, 8, 64))


def test_the_speculator_follows_the_measurement_unless_a_limit_is_given():
    measured = Speculator(SpeculativeConfig(num_speculative_tokens=4), AMX)
    assert [measured.is_on_for(b) for b in (1, 8, 16, 64, 200)] == [True, True, False, False, False]
    limited = Speculator(SpeculativeConfig(disable_by_batch_size=100), AMX)
    assert limited.is_on_for(64) and not limited.is_on_for(101)
    unmeasured = Speculator(SpeculativeConfig())
    assert unmeasured.is_on_for(1) and unmeasured.is_on_for(1000)


def test_the_startup_line_says_where_speculation_runs():
    from sluice.engine.startup import describe_speculation

    assert describe_speculation(None, AMX) == "no speculation (--speculative-config none)"
    config = SpeculativeConfig(num_speculative_tokens=4)
    assert describe_speculation(config, AMX) == (
        "n-gram speculation (k=4, n 1..16) in steps of up to about 8 running requests "
        "(measured at load)"
    )
    assert "in no step" in describe_speculation(config, COMPUTE_BOUND)
    assert "in every step" in describe_speculation(config, ())
    limited = SpeculativeConfig(disable_by_batch_size=8)
    assert describe_speculation(limited, AMX).endswith("in steps of up to 8 running requests")


def test_a_requests_drafts_grow_while_accepted_and_shrink_after_a_miss():
    from sluice.engine.speculation import next_draft_length

    assert next_draft_length(4, 4, 16) == 8
    assert next_draft_length(8, 8, 16) == 16
    assert next_draft_length(16, 16, 16) == 16
    assert next_draft_length(8, 3, 16) == 4
    assert next_draft_length(16, 12, 16) == 13
    assert next_draft_length(8, 0, 16) == 4
    assert next_draft_length(1, 0, 16) == 1
    assert next_draft_length(2, 1, 16) == 2


def test_a_drafted_rows_price_is_what_the_engine_measured_it_to_cost():
    from sluice.engine.speculation import COST_MARGIN, StepCosts

    costs = StepCosts()
    assert costs.required_acceptance(16) == 0.0  # nothing measured: draft, and measure
    costs.observe(16, 8, 0.016 + 8 * 0.0004)
    costs.observe(16, 8, 0.016 + 8 * 0.0004)
    assert costs.line(16) is None  # every step drafted as many rows: no line yet
    # Steps of 16 decodes take 16 ms plus 0.4 ms a drafted row; no step
    # without drafts is ever seen, the line's intercept gives it.
    for drafted in (2, 30, 5, 17, 0, 24, 9):
        costs.observe(16, drafted, 0.016 + drafted * 0.0004)
    base, per_row = costs.line(16)
    assert base == pytest.approx(0.016) and per_row == pytest.approx(0.0004)
    assert costs.required_acceptance(16) == pytest.approx(0.4 * COST_MARGIN)
    for drafted in (1, 16, 3, 12):  # one decode alone: 8 ms a token, rows cost little
        costs.observe(1, drafted, 0.008 + drafted * 0.0004)
    assert costs.required_acceptance(1) == pytest.approx(0.05 * COST_MARGIN)
    assert costs.required_acceptance(64) == 0.0  # each batch size is its own line


def test_a_request_whose_drafts_miss_stops_drafting_then_tries_again():
    from sluice.engine.request import Request
    from sluice.engine.sampling_params import SamplingParams

    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=4))
    for drafted in (0, 16, 4, 10):  # break-even: 0.3 * COST_MARGIN accepted
        speculator.costs.observe(16, drafted, 0.016 + drafted * 0.0003)
    request = Request("r", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=50))
    assert speculator.propose(request, 10, num_running=16) == [3, 1, 2, 3]
    for _ in range(4):  # its drafts keep missing
        speculator.record(request, 4, 0)
    assert request.draft_acceptance < 0.5
    assert speculator.propose(request, 10, num_running=16) == []  # no rows it won't pay for
    assert speculator.propose(request, 10, num_running=1) == [3, 1]  # unmeasured: draft (shorter)
    steps_off = 1
    while not speculator.propose(request, 10, num_running=16):
        steps_off += 1
    assert 5 <= steps_off <= 30  # it creeps back and tries again


def test_only_steps_of_decodes_are_measured():
    from sluice.engine.scheduler import ScheduledRequest, SchedulerPlan
    from sluice.engine.speculation import StepCosts

    def scheduled(num_new: int, draft: list[int], samples: bool = True):
        request = ScheduledRequest.__new__(ScheduledRequest)
        request.num_new_tokens, request.draft_token_ids, request.samples = num_new, draft, samples
        return request

    def observe(costs, plan, seconds):  # as EngineCore.step does
        if (rows := plan.decode_rows()) is not None:
            costs.observe(*rows, seconds)

    costs = StepCosts()
    observe(costs, SchedulerPlan([scheduled(1, []), scheduled(3, [7, 8])]), 0.004)
    observe(costs, SchedulerPlan([scheduled(1, []), scheduled(1, [])]), 0.002)
    observe(costs, SchedulerPlan([scheduled(5, [1, 2, 3, 4]), scheduled(1, [])]), 0.006)
    assert costs.line(2) == (pytest.approx(0.002), pytest.approx(0.001))
    for _ in range(5):  # prefill chunks: not decode steps, whatever they took
        observe(costs, SchedulerPlan([scheduled(1, []), scheduled(64, [])]), 0.5)
        observe(costs, SchedulerPlan([scheduled(1, []), scheduled(1, [], False)]), 0.5)
    assert costs.line(2) == (pytest.approx(0.002), pytest.approx(0.001))
