"""The host-RAM tier under the KV block pool (sluice/engine/kv_tiers.py): the
LRU store's byte bound, the pool's moves applied in order, and, on the tiny
model, a prefix restored from RAM giving bitwise the tokens and logprobs of
a cold run under random prompts and chunk budgets."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from sluice.config import CacheConfig, EngineConfig, SchedulerConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.kv_tiers import HostBlockStore, KVTiers, default_ram_bytes, tier_stats
from sluice.engine.request import Request
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.loaded_model import LoadedModel
from sluice.models import calibration
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.native.int8 import int8_gemm_kernels
from tests.invariance_runs import bf16_loaded, random_prompt

BLOCK_SIZE = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
# A pool the flood request fills whole (250 + 6 tokens, the last never computed):
# every cached block of the requests before it is evicted.
FLOOD_TOKENS = 250
FLOOD_BLOCKS = 64


def tier_core(
    loaded: LoadedModel, *, num_blocks: int, budget: int, ram_bytes: int | None = 1 << 30, **cache
) -> EngineCore:
    """An in-process core on `loaded` with a pool of `num_blocks` blocks and a RAM tier."""
    bytes_per_block = kv_cache_bytes_per_block(loaded.model_config, BLOCK_SIZE, torch.bfloat16)
    config = EngineConfig(
        cache=CacheConfig(
            block_size_tokens=BLOCK_SIZE,
            kv_cache_memory_bytes=num_blocks * bytes_per_block,
            kv_offload_bytes=ram_bytes,
            **cache,
        ),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget),
        multiprocess=False,
    )
    return EngineCore(config, loaded=loaded)


def run(core: EngineCore, prompt: list[int], request_id: str = "r"):
    """(tokens, logprobs, top ids, top logprobs, cached tokens) of one greedy request."""
    core.add_request(generation_request(request_id, prompt, GREEDY))
    tokens, logprobs, top_ids, top_logprobs, cached = [], [], [], [], 0
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens += delta.new_token_ids
            logprobs += delta.logprobs.logprobs
            top_ids += delta.logprobs.top_token_ids
            top_logprobs += delta.logprobs.top_logprobs
            cached = delta.num_cached_tokens or cached
    return (tokens, logprobs, top_ids, top_logprobs), cached


@pytest.fixture(scope="module")
def row_invariant(tiny_loaded, tiny_llama) -> LoadedModel:
    """The default's scheme (bf16, row-invariant int8 matmuls) on the tiny model."""
    if int8_gemm_kernels() is None:
        pytest.skip("no native int8 matmul (AVX512-VNNI) here")
    loaded = bf16_loaded(tiny_loaded, tiny_llama, batch_invariant=False)
    rng = random.Random(7)
    calibration.quantize_row_invariant(loaded.model, [rng.randrange(3, 512) for _ in range(300)])
    return replace(loaded, max_model_len=256)


# -- the store ---------------------------------------------------------------


def test_the_ram_store_drops_the_least_recently_used_past_its_bound():
    store = HostBlockStore(capacity_bytes=30)
    for name in (b"a", b"b", b"c"):
        assert store.put(name, torch.zeros(10, dtype=torch.uint8))
    store.get(b"a")  # now the most recent
    store.put(b"d", torch.zeros(10, dtype=torch.uint8))
    assert b"b" not in store and {b"a", b"c", b"d"} == {n for n in (b"a", b"c", b"d") if n in store}
    assert store.num_bytes == 30 and store.num_evicted == 1


def test_a_block_larger_than_the_ram_bound_is_not_kept():
    store = HostBlockStore(capacity_bytes=9)
    assert not store.put(b"a", torch.zeros(10, dtype=torch.uint8))
    assert len(store) == 0 and store.num_bytes == 0


def test_the_default_ram_bound_is_8_gib_or_a_quarter_of_available_memory():
    assert default_ram_bytes(None) == 8 << 30
    assert default_ram_bytes(64 << 30) == 8 << 30
    assert default_ram_bytes(8 << 30) == 2 << 30


# -- the pool's moves ----------------------------------------------------------


def pool_and_tiers(num_blocks: int, ram_bytes: int = 1 << 20):
    caches = [torch.zeros(2, num_blocks, BLOCK_SIZE, 1, 2) for _ in range(3)]
    tiers = KVTiers(caches, BLOCK_SIZE, HostBlockStore(ram_bytes))
    return KVCacheManager(num_blocks, BLOCK_SIZE, tier=tiers), tiers, caches


def fill(kv: KVCacheManager, tiers: KVTiers, caches, request: Request) -> None:
    """Compute the request's tokens as the engine would: allocate, apply the
    moves, write a recognisable value per token, name the blocks."""
    assert kv.allocate_slots(request, request.num_tokens - request.num_computed_tokens)
    tiers.apply(kv.take_transfers())
    for position in range(request.num_computed_tokens, request.num_tokens):
        block = request.block_ids[position // BLOCK_SIZE]
        for cache in caches:
            cache[:, block, position % BLOCK_SIZE] = float(request.all_token_ids[position])
    request.num_computed_tokens = request.num_tokens
    kv.cache_full_blocks(request)


def test_an_evicted_block_comes_back_from_ram_with_its_contents():
    kv, tiers, caches = pool_and_tiers(num_blocks=4)
    first = Request("first", list(range(10, 22)), GREEDY)  # 3 full blocks
    kv.take_cached_prefix(first)
    fill(kv, tiers, caches, first)
    kv.free(first)
    tiers.apply(kv.take_transfers())
    other = Request("other", list(range(50, 66)), GREEDY)  # takes all 4 blocks
    kv.take_cached_prefix(other)
    fill(kv, tiers, caches, other)  # evicts first's blocks: copied out before being written
    kv.free(other)
    again = Request("again", list(range(10, 22)) + [99], GREEDY)
    assert kv.take_cached_prefix(again) == 12
    tiers.apply(kv.take_transfers())
    for position in range(12):
        block = again.block_ids[position // BLOCK_SIZE]
        assert all(float(c[0, block, position % BLOCK_SIZE, 0, 0]) == 10 + position for c in caches)
    assert tiers.stats.hit_tokens == 12
    kv.check_consistency([again])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14)), min_size=1, max_size=12))
def test_whatever_the_traffic_every_cached_block_holds_its_own_tokens(requests):
    """Random prompts over a tiny pool and a tiny RAM tier: a block found by a
    lookup (in the pool or reloaded) always holds the tokens of its name."""
    kv, tiers, caches = pool_and_tiers(num_blocks=6, ram_bytes=5 * 2 * BLOCK_SIZE * 2 * 3 * 4)
    for index, (seed, length) in enumerate(requests):
        rng = random.Random(seed)
        prompt = [rng.randrange(1, 40) for _ in range(length)]
        request = Request(f"r{index}", prompt, GREEDY)
        num_cached = kv.take_cached_prefix(request)
        tiers.apply(kv.take_transfers())
        for position in range(num_cached):
            block = request.block_ids[position // BLOCK_SIZE]
            assert float(caches[0][1, block, position % BLOCK_SIZE, 0, 1]) == prompt[position]
        if not kv.can_allocate(request, length - num_cached):
            kv.free(request)
            tiers.apply(kv.take_transfers())
            continue
        fill(kv, tiers, caches, request)
        kv.free(request)
        tiers.apply(kv.take_transfers())
        kv.check_consistency([])
    assert tiers.ram is not None and tiers.ram.num_bytes <= tiers.ram.capacity_bytes


# -- the engine ----------------------------------------------------------------


@settings(max_examples=6, deadline=None, phases=(Phase.explicit, Phase.generate))
@given(
    seed=st.integers(0, 10_000),
    length=st.integers(9, 240),
    budgets=st.tuples(*[st.sampled_from([5, 16, 37, 64, 256])] * 3),
)
def test_a_prefix_restored_from_ram_gives_the_bits_of_a_cold_run(
    row_invariant, seed, length, budgets
):
    rng = random.Random(seed)
    prompt = random_prompt(rng, length)
    cold, _ = run(tier_core(row_invariant, num_blocks=200, budget=budgets[0], ram_bytes=0), prompt)
    core = tier_core(row_invariant, num_blocks=FLOOD_BLOCKS, budget=budgets[1])
    run(core, prompt, "first")
    run(core, random_prompt(rng, FLOOD_TOKENS), "flood")  # evicts every block of the first
    restored, cached = run(core, prompt, "again")
    stats = tier_stats(core.tiers)
    assert stats is not None and stats.hit_tokens > 0 and cached >= stats.hit_tokens
    assert restored == cold


def test_without_the_ram_tier_the_same_traffic_recomputes(row_invariant):
    """The test above can fail: with the tier off the prefix is gone."""
    rng = random.Random(1)
    prompt = random_prompt(rng, 200)
    core = tier_core(row_invariant, num_blocks=FLOOD_BLOCKS, budget=64, ram_bytes=0)
    run(core, prompt, "first")
    run(core, random_prompt(rng, FLOOD_TOKENS), "flood")
    _, cached = run(core, prompt, "again")
    assert core.tiers is None and cached == 0


def test_usage_counts_tokens_from_the_pool_and_the_ram_tier(row_invariant):
    rng = random.Random(2)
    prompt = random_prompt(rng, 120)
    core = tier_core(row_invariant, num_blocks=FLOOD_BLOCKS, budget=64)
    run(core, prompt, "first")
    _, in_pool = run(core, prompt + [5], "pool")
    run(core, random_prompt(rng, FLOOD_TOKENS), "flood")
    _, from_ram = run(core, prompt + [5], "ram")
    assert in_pool == from_ram == 120
    stats = core.stats()
    assert stats.prefix_cache_hit_tokens >= 240
    assert stats.kv_tiers is not None and stats.kv_tiers.hit_tokens == 120
    assert stats.kv_tiers.transfer_bytes["ram_to_pool"] > 0


def test_reset_prefix_cache_empties_the_ram_tier(row_invariant):
    from sluice.engine.messages import ResetPrefixCache

    rng = random.Random(3)
    prompt = random_prompt(rng, 120)
    core = tier_core(row_invariant, num_blocks=FLOOD_BLOCKS, budget=64)
    run(core, prompt, "first")
    run(core, random_prompt(rng, FLOOD_TOKENS), "flood")
    core.handle(ResetPrefixCache(), [], [])
    _, cached = run(core, prompt, "again")
    assert cached == 0


def test_the_tiers_are_described_at_start(tmp_path):
    from sluice.engine.kv_disk import DiskBlockStore
    from sluice.engine.kv_tier_setup import describe_tiers

    tiers = KVTiers([torch.zeros(2, 4, BLOCK_SIZE, 1, 2)], BLOCK_SIZE, HostBlockStore(1 << 30))
    assert describe_tiers(tiers) == (
        "prefix cache tiers: RAM up to 1.0 GiB (16,777,216 blocks of 4 tokens)"
    )
    tiers.disk = DiskBlockStore(tmp_path, bytes(16), tiers.block_bytes, 2 << 30)
    assert describe_tiers(tiers).endswith(f"disk {tiers.disk.folder} up to 2.0 GiB")
    tiers.close()


def test_available_memory_is_read_from_meminfo(tmp_path):
    from sluice.engine.kv_tiers import available_memory_bytes

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    assert available_memory_bytes(meminfo) == 2048 * 1024
    assert available_memory_bytes(tmp_path / "absent") is None


def test_the_default_engine_has_the_ram_tier_on(row_invariant):
    core = tier_core(row_invariant, num_blocks=FLOOD_BLOCKS, budget=64, ram_bytes=None)
    assert core.tiers is not None and core.tiers.ram is not None and core.tiers.disk is None
    assert 0 < core.tiers.ram.capacity_bytes <= 8 << 30
    without_prefix_caching = tier_core(
        row_invariant, num_blocks=FLOOD_BLOCKS, budget=64, enable_prefix_caching=False
    )
    assert without_prefix_caching.tiers is None
