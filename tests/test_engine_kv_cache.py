"""KVCacheManager: block tables grow on demand, all or nothing, and every block
comes back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.request import Request
from sluice.engine.sampling_params import SamplingParams


def make_request(request_id: str = "r", num_prompt_tokens: int = 10) -> Request:
    return Request(request_id, list(range(num_prompt_tokens)), SamplingParams())


def test_allocation_grows_the_block_table_to_cover_the_new_tokens():
    kv = KVCacheManager(num_blocks=8, block_size_tokens=4)
    request = make_request()
    assert kv.allocate_slots(request, 10)
    assert len(request.block_ids) == 3  # ceil(10 / 4)
    request.num_computed_tokens = 10
    assert kv.allocate_slots(request, 2)  # slots 10, 11 are still in block 2
    assert len(request.block_ids) == 3
    assert kv.allocate_slots(request, 3)
    assert len(request.block_ids) == 4
    assert kv.num_free_blocks == 4
    kv.check_consistency([request])


def test_a_failed_allocation_changes_nothing():
    kv = KVCacheManager(num_blocks=4, block_size_tokens=4)
    first, second = make_request("a"), make_request("b")
    assert kv.allocate_slots(first, 12)
    table = list(second.block_ids)
    assert not kv.can_allocate(second, 8)
    assert not kv.allocate_slots(second, 8)
    assert second.block_ids == table
    assert kv.num_free_blocks == 1
    assert kv.can_allocate(second, 4)
    kv.check_consistency([first, second])


def test_free_returns_every_block_and_is_idempotent():
    kv = KVCacheManager(num_blocks=6, block_size_tokens=4)
    request = make_request()
    kv.allocate_slots(request, 17)
    assert kv.num_free_blocks == 1
    kv.free(request)
    assert request.block_ids == []
    assert kv.num_free_blocks == 6
    kv.free(request)
    assert kv.num_free_blocks == 6
    kv.check_consistency([request])


def test_usage_is_the_fraction_of_blocks_in_use():
    kv = KVCacheManager(num_blocks=4, block_size_tokens=2)
    request = make_request()
    assert kv.usage == 0.0
    kv.allocate_slots(request, 3)
    assert kv.usage == 0.5
    kv.allocate_slots(request, 8)
    assert kv.usage == 1.0


def test_the_pool_refuses_empty_sizes():
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=0, block_size_tokens=16)
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=4, block_size_tokens=0)


def test_consistency_check_catches_a_block_in_two_tables():
    kv = KVCacheManager(num_blocks=4, block_size_tokens=4)
    first, second = make_request("a"), make_request("b")
    kv.allocate_slots(first, 4)
    second.block_ids.append(first.block_ids[0])
    with pytest.raises(AssertionError, match="shares a block"):
        kv.check_consistency([first, second])


def test_consistency_check_catches_a_lost_block():
    kv = KVCacheManager(num_blocks=4, block_size_tokens=4)
    request = make_request()
    kv.allocate_slots(request, 4)
    request.block_ids.clear()  # dropped without being freed
    with pytest.raises(AssertionError, match="owned blocks in no table"):
        kv.check_consistency([request])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.booleans(), st.integers(1, 12)),
        max_size=40,
    )
)
def test_any_sequence_of_allocations_and_frees_keeps_the_pool_whole(operations):
    kv = KVCacheManager(num_blocks=10, block_size_tokens=3)
    requests = {name: make_request(name) for name in "abcd"}
    for name, is_free, num_new_tokens in operations:
        request = requests[name]
        if is_free:
            kv.free(request)
            request.num_computed_tokens = 0
            continue
        num_free_before, table_before = kv.num_free_blocks, list(request.block_ids)
        if kv.allocate_slots(request, num_new_tokens):
            request.num_computed_tokens += num_new_tokens
            assert len(request.block_ids) * 3 >= request.num_computed_tokens
        else:
            assert (kv.num_free_blocks, request.block_ids) == (num_free_before, table_before)
        kv.check_consistency(requests.values())
    for request in requests.values():
        kv.free(request)
    assert kv.num_free_blocks == 10
    kv.check_consistency(requests.values())
