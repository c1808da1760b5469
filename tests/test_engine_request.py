"""Request: one counter model, all_token_ids kept in place, deltas that carry
each token once."""

from __future__ import annotations

import pytest

from sluice.engine.request import Request, RequestStatus
from sluice.engine.sampled import SampledToken
from sluice.engine.sampling_params import SamplingParams


def make_request(logprobs: int | None = None) -> Request:
    return Request("r1", [5, 6, 7], SamplingParams(logprobs=logprobs))


def sampled(token_id: int, k: int = 5) -> SampledToken:
    return SampledToken(
        token_id=token_id,
        logprob=-0.5,
        top_token_ids=tuple(range(100, 100 + k)),
        top_logprobs=tuple(-float(i) for i in range(k)),
    )


def test_a_new_request_needs_its_whole_prompt_computed():
    request = make_request()
    assert request.num_tokens == request.num_prompt_tokens == 3
    assert request.num_computed_tokens == 0
    assert request.num_uncomputed_tokens == 3
    assert request.status is RequestStatus.WAITING
    assert request.block_ids == []


def test_all_token_ids_is_prompt_plus_output_appended_in_place():
    request = make_request()
    all_token_ids = request.all_token_ids
    assert all_token_ids is not request.prompt_token_ids
    request.append_output_token(sampled(8))
    request.append_output_token(sampled(9))
    assert request.all_token_ids is all_token_ids
    assert all_token_ids == [5, 6, 7, 8, 9]
    assert request.prompt_token_ids == [5, 6, 7]
    assert request.output_token_ids == [8, 9]
    assert request.num_tokens == 5


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (RequestStatus.WAITING, None),
        (RequestStatus.RUNNING, None),
        (RequestStatus.PREEMPTED, None),
        (RequestStatus.FINISHED_STOPPED, "stop"),
        (RequestStatus.FINISHED_LENGTH, "length"),
        (RequestStatus.FINISHED_ABORTED, "abort"),
    ],
)
def test_only_finished_statuses_carry_a_finish_reason(status, reason):
    assert status.finish_reason == reason
    assert status.is_finished == (reason is not None)


def test_a_delta_carries_only_the_tokens_since_the_previous_delta():
    request = make_request()
    request.append_output_token(sampled(8))
    request.append_output_token(sampled(9))
    first = request.take_delta()
    request.append_output_token(sampled(10))
    second = request.take_delta()
    assert first.new_token_ids == (8, 9)
    assert second.new_token_ids == (10,)
    assert second.num_prompt_tokens == 3
    assert second.logprobs is None
    assert second.finish_reason is None
    assert request.take_delta().new_token_ids == ()


def test_the_final_delta_names_the_finish_reason_and_stop_token():
    request = make_request()
    request.append_output_token(sampled(2))
    request.status = RequestStatus.FINISHED_STOPPED
    request.stop_token_id = 2
    delta = request.take_delta()
    assert delta.is_finished
    assert (delta.finish_reason, delta.stop_token_id) == ("stop", 2)


def test_logprobs_have_one_entry_per_token_with_the_samplers_top_k():
    request = make_request(logprobs=2)
    request.append_output_token(sampled(8, k=2))
    request.append_output_token(sampled(9, k=2))
    logprobs = request.take_delta().logprobs
    assert logprobs is not None
    assert logprobs.logprobs == (-0.5, -0.5)
    assert logprobs.top_token_ids == ((100, 101), (100, 101))
    assert logprobs.top_logprobs == ((-0.0, -1.0), (-0.0, -1.0))
    request.append_output_token(sampled(10, k=2))
    assert request.take_delta().logprobs.logprobs == (-0.5,)


def test_logprobs_zero_keeps_only_the_sampled_tokens_logprob():
    request = make_request(logprobs=0)
    request.append_output_token(sampled(8, k=0))
    logprobs = request.take_delta().logprobs
    assert logprobs.logprobs == (-0.5,)
    assert logprobs.top_token_ids == ((),)


def test_a_sampler_that_omits_asked_logprobs_breaks_an_invariant():
    request = make_request(logprobs=1)
    with pytest.raises(AssertionError, match="logprobs"):
        request.append_output_token(SampledToken(token_id=8))
