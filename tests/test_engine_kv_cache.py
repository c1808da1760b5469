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


def test_requests_one_after_another_reuse_the_written_blocks_without_prefix_caching():
    kv = KVCacheManager(num_blocks=100, block_size_tokens=4, enable_prefix_caching=False)
    for index in range(20):
        request = make_request(f"r{index}", 10)
        assert kv.allocate_slots(request, 10)
        assert sorted(request.block_ids) == [0, 1, 2]
        kv.free(request)
    assert kv.num_written_blocks == 3
    kv.check_consistency()


def test_written_blocks_count_each_block_once_at_its_first_hand_out():
    kv = KVCacheManager(num_blocks=8, block_size_tokens=4)
    first, second = make_request("a", 12), make_request("b", 5)
    assert kv.num_written_blocks == 0
    assert kv.allocate_slots(first, 12) and kv.allocate_slots(second, 5)
    assert kv.num_written_blocks == 5
    kv.free(second)  # nameless blocks: the next allocation takes them again
    third = make_request("c", 8)
    assert kv.allocate_slots(third, 8)
    assert set(third.block_ids) == {3, 4} and kv.num_written_blocks == 5
    assert kv.allocate_slots(third, 12)
    assert kv.num_written_blocks == 6
    kv.check_consistency([first, third])


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
    with pytest.raises(AssertionError, match="reference counts disagree"):
        kv.check_consistency([first, second])


def test_consistency_check_catches_a_lost_block():
    kv = KVCacheManager(num_blocks=4, block_size_tokens=4)
    request = make_request()
    kv.allocate_slots(request, 4)
    request.block_ids.clear()  # dropped without being freed
    with pytest.raises(AssertionError, match="reference counts disagree"):
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


# -- prefix caching ------------------------------------------------------------------

BLOCK = 4


def computed(kv: KVCacheManager, request: Request) -> Request:
    """Give `request` blocks for all its tokens, mark them computed and named."""
    kv.take_cached_prefix(request)
    assert kv.allocate_slots(request, request.num_uncomputed_tokens)
    request.num_computed_tokens = request.num_tokens
    kv.cache_full_blocks(request)
    return request


def prompt_request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, list(tokens), SamplingParams())


@pytest.mark.parametrize("num_tokens", range(1, 3 * BLOCK + 2))
def test_a_repeated_prompt_hits_every_full_block_but_always_computes_its_last_token(num_tokens):
    kv = KVCacheManager(num_blocks=16, block_size_tokens=BLOCK)
    tokens = list(range(100, 100 + num_tokens))
    first = computed(kv, prompt_request("a", tokens))
    kv.free(first)
    second = prompt_request("b", tokens)
    num_hit = kv.take_cached_prefix(second)
    assert num_hit == (num_tokens - 1) // BLOCK * BLOCK
    assert second.num_computed_tokens == num_hit and second.num_uncomputed_tokens >= 1
    assert second.block_ids == first_blocks(first, kv, num_hit)
    kv.check_consistency([second])


def first_blocks(first: Request, kv: KVCacheManager, num_tokens: int) -> list[int]:
    # `first` was freed: its table is gone, but its blocks kept their names.
    return [kv._block_by_hash[h] for h in first.block_hashes[: num_tokens // BLOCK]]


def test_a_prefix_matches_block_by_block_up_to_the_first_difference():
    kv = KVCacheManager(num_blocks=16, block_size_tokens=BLOCK)
    tokens = list(range(100, 112))  # three full blocks
    kv.free(computed(kv, prompt_request("a", tokens)))
    for differ_at, expected in [(0, 0), (3, 0), (4, 4), (7, 4), (8, 8), (11, 8)]:
        other = tokens.copy()
        other[differ_at] = 999
        request = prompt_request(f"x{differ_at}", [*other, 1, 2])
        assert kv.take_cached_prefix(request) == expected, differ_at
        kv.free(request)
        request.num_computed_tokens = 0
    kv.check_consistency([])


def test_a_shared_block_outlives_the_abort_of_one_of_its_holders():
    kv = KVCacheManager(num_blocks=8, block_size_tokens=BLOCK)
    tokens = list(range(100, 109))
    first = computed(kv, prompt_request("a", tokens))
    second = computed(kv, prompt_request("b", tokens))
    shared = second.block_ids[:2]
    assert shared == first.block_ids[:2] and second.num_cached_tokens == 0
    assert all(kv.num_holders(block) == 2 for block in shared)
    kv.free(first)  # aborted
    assert all(kv.num_holders(block) == 1 for block in shared)
    assert kv.num_free_blocks == 8 - len(second.block_ids)
    kv.check_consistency([second])


def test_cached_blocks_are_evicted_only_when_no_free_block_is_left_least_recent_first():
    kv = KVCacheManager(num_blocks=6, block_size_tokens=BLOCK)
    old = computed(kv, prompt_request("old", list(range(100, 108))))  # 2 blocks, named
    new = computed(kv, prompt_request("new", list(range(200, 208))))  # 2 blocks, named
    old_blocks, new_blocks = list(old.block_ids), list(new.block_ids)
    kv.free(old)
    kv.free(new)
    assert kv.num_free_blocks == 6 and kv.usage == 0.0
    taker = prompt_request("taker", list(range(300, 316)))  # needs 4 blocks
    assert kv.allocate_slots(taker, 16)
    # The 2 never-named blocks first, then old's tail and head; new's stay cached.
    assert taker.block_ids[2:] == [old_blocks[1], old_blocks[0]]
    again = prompt_request("again", [*range(200, 208), 5])
    assert kv.take_cached_prefix(again) == 8 and again.block_ids == new_blocks
    lost = prompt_request("lost", [*range(100, 108), 5])
    assert kv.take_cached_prefix(lost) == 0
    kv.check_consistency([taker, again, lost])


def test_without_prefix_caching_or_after_a_reset_nothing_is_found():
    off = KVCacheManager(num_blocks=8, block_size_tokens=BLOCK, enable_prefix_caching=False)
    tokens = list(range(100, 109))
    off.free(computed(off, prompt_request("a", tokens)))
    assert off.take_cached_prefix(prompt_request("b", tokens)) == 0
    kv = KVCacheManager(num_blocks=8, block_size_tokens=BLOCK)
    kv.free(computed(kv, prompt_request("a", tokens)))
    kv.reset_prefix_cache()
    assert kv.take_cached_prefix(prompt_request("b", tokens)) == 0
    kv.check_consistency()


def test_the_salt_keeps_caches_of_different_models_apart():
    tokens = list(range(100, 109))
    one = KVCacheManager(num_blocks=8, block_size_tokens=BLOCK, cache_salt=b"model-a")
    two = KVCacheManager(num_blocks=8, block_size_tokens=BLOCK, cache_salt=b"model-b")
    assert (
        computed(one, prompt_request("a", tokens)).block_hashes
        != computed(two, prompt_request("a", tokens)).block_hashes
    )
