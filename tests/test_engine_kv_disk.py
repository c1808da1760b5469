"""The disk tier (sluice/engine/kv_disk.py): files written whole or not at all,
bad files (torn, corrupted, foreign) ignored and counted, the byte bound, a
failing disk, and two stores on one folder; on the tiny model, a restarted
engine reusing a prefix from disk with the bits of a cold run."""

from __future__ import annotations

import errno
import os
import random
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sluice.config import CacheConfig, EngineConfig, SchedulerConfig
from sluice.engine import kv_disk
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.kv_disk import HEADER, DiskBlockStore
from sluice.engine.messages import Shutdown
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.loaded_model import LoadedModel
from sluice.models import calibration
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.native.int8 import int8_gemm_kernels
from tests.invariance_runs import bf16_loaded, random_prompt

BLOCK_BYTES = 64
FINGERPRINT = bytes(range(16))
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)


def name(i: int) -> bytes:
    return i.to_bytes(16, "little")


def block(i: int) -> torch.Tensor:
    return torch.full((BLOCK_BYTES,), i % 251, dtype=torch.uint8)


def store_at(folder: Path, capacity_bytes: int = 1 << 20, fingerprint=FINGERPRINT):
    return DiskBlockStore(folder, fingerprint, BLOCK_BYTES, capacity_bytes)


def written(store: DiskBlockStore, *indices: int) -> DiskBlockStore:
    for i in indices:
        store.write(name(i), block(i))
    store.flush()
    return store


# -- files -------------------------------------------------------------------


def test_a_written_block_reads_back_whole(tmp_path):
    store = written(store_at(tmp_path), 1)
    assert torch.equal(store.read(name(1)), block(1))
    assert store.stats.num_hits == 1 and store.stats.num_written == 1
    assert store.read(name(2)) is None and store.stats.num_misses == 1
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(kv_disk.TEMP_PREFIX)]


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # torn: a writer killed mid-way
        lambda data: data[:-1] + bytes([data[-1] ^ 1]),  # one bit of the payload
        lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:],  # the header's fingerprint
        lambda data: b"",
        lambda data: data + b"x",
    ],
    ids=["truncated", "payload bit", "header bit", "empty", "too long"],
)
def test_a_damaged_file_is_ignored_counted_and_removed(tmp_path, damage):
    store = written(store_at(tmp_path), 1)
    path = store.path_of(name(1))
    path.write_bytes(damage(path.read_bytes()))
    assert store.read(name(1)) is None
    assert store.stats.num_bad_files == 1 and not path.exists()


def test_a_file_of_another_model_or_block_is_never_used(tmp_path):
    foreign = written(store_at(tmp_path, fingerprint=bytes(16)), 1)
    ours = store_at(tmp_path)
    ours.path_of(name(1)).parent.mkdir(parents=True, exist_ok=True)
    os.replace(foreign.path_of(name(1)), ours.path_of(name(1)))  # a foreign file in our place
    written(ours, 2)
    ours.path_of(name(3)).parent.mkdir(parents=True, exist_ok=True)
    os.replace(ours.path_of(name(2)), ours.path_of(name(3)))  # block 2's file named as 3
    assert ours.read(name(1)) is None and ours.read(name(3)) is None
    assert ours.stats.num_bad_files == 2


def test_a_stores_files_are_apart_from_another_fingerprints(tmp_path):
    written(store_at(tmp_path, fingerprint=bytes(16)), 1)
    assert store_at(tmp_path).read(name(1)) is None


def test_the_header_says_what_the_file_holds(tmp_path):
    store = written(store_at(tmp_path), 7)
    magic, version, fingerprint, block_name, length, _ = HEADER.unpack_from(
        store.path_of(name(7)).read_bytes()
    )
    assert (magic, version, fingerprint, block_name, length) == (
        kv_disk.MAGIC,
        kv_disk.FORMAT_VERSION,
        FINGERPRINT,
        name(7),
        BLOCK_BYTES,
    )


# -- the bound and a failing disk ----------------------------------------------


def test_the_folder_stays_within_its_bound_dropping_the_least_recently_used(tmp_path):
    file_bytes = HEADER.size + BLOCK_BYTES
    store = written(store_at(tmp_path, capacity_bytes=4 * file_bytes), 1, 2, 3)
    os.utime(store.path_of(name(1)), (1, 1))  # long unused
    for i in (2, 3):
        os.utime(store.path_of(name(i)), (2, 2))
    assert store.read(name(1)) is not None  # a hit makes it the most recent
    written(store, 4, 5)
    assert sum(p.stat().st_size for p in tmp_path.rglob("*.kvb")) <= 4 * file_bytes
    assert store.read(name(1)) is not None and store.read(name(2)) is None
    assert store.stats.num_evicted >= 1


def test_a_bound_below_one_block_writes_nothing(tmp_path):
    store = written(store_at(tmp_path, capacity_bytes=BLOCK_BYTES), 1)
    assert store.read(name(1)) is None and store.stats.num_written == 0


def test_a_full_disk_fails_writes_quietly_and_counts_them(tmp_path, monkeypatch):
    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kv_disk.os, "fsync", no_space)
    store = written(store_at(tmp_path), 1, 2)
    assert store.stats.num_write_failures == 2 and store.stats.num_written == 0
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no temp file left
    assert store.read(name(1)) is None


def test_a_folder_that_cannot_be_made_fails_writes_quietly(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = written(store_at(blocker / "kv"), 1)
    assert store.stats.num_write_failures == 1 and store.read(name(1)) is None


def test_a_stale_temp_file_is_removed_and_never_read(tmp_path):
    store = written(store_at(tmp_path), 1)
    temp = store.path_of(name(2)).parent / f"{kv_disk.TEMP_PREFIX}1-1-{name(2).hex()}.kvb"
    temp.parent.mkdir(parents=True, exist_ok=True)
    temp.write_bytes(store.path_of(name(1)).read_bytes())
    os.utime(temp, (1, 1))
    assert store.read(name(2)) is None
    store_at(tmp_path)  # a new server's first scan
    assert not temp.exists()


def test_two_stores_writing_one_folder_at_once_leave_only_whole_files(tmp_path):
    stores = [store_at(tmp_path), store_at(tmp_path)]
    threads = [threading.Thread(target=written, args=(store, *range(40))) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reader = store_at(tmp_path)
    assert all(torch.equal(reader.read(name(i)), block(i)) for i in range(40))
    assert reader.stats.num_bad_files == 0


# -- the engine ----------------------------------------------------------------


@pytest.fixture(scope="module")
def row_invariant(tiny_loaded, tiny_llama) -> LoadedModel:
    """The default's scheme (bf16, row-invariant int8 matmuls) on the tiny model."""
    if int8_gemm_kernels() is None:
        pytest.skip("no native int8 matmul (AVX512-VNNI) here")
    loaded = bf16_loaded(tiny_loaded, tiny_llama, batch_invariant=False)
    rng = random.Random(7)
    calibration.quantize_row_invariant(loaded.model, [rng.randrange(3, 512) for _ in range(300)])
    return replace(loaded, max_model_len=256)


def disk_core(
    loaded: LoadedModel, folder: Path | None, budget: int = 64, kv_cache_dtype: str = "auto"
) -> EngineCore:
    """A core whose pool holds 128 blocks of 4 tokens, no RAM tier, the disk tier at `folder`."""
    kv_dtype = torch.int8 if kv_cache_dtype == "int8" else torch.bfloat16
    bytes_per_block = kv_cache_bytes_per_block(
        loaded.model_config, 4, torch.bfloat16, kv_dtype=kv_dtype
    )
    cache = CacheConfig(
        block_size_tokens=4,
        kv_cache_memory_bytes=128 * bytes_per_block,
        kv_offload_bytes=0,
        kv_cache_dir=folder,
        kv_cache_dtype=kv_cache_dtype,
    )
    config = EngineConfig(
        cache=cache, scheduler=SchedulerConfig(max_num_batched_tokens=budget), multiprocess=False
    )
    return EngineCore(config, loaded=loaded)


def run(core: EngineCore, prompt: list[int], request_id: str = "r"):
    core.add_request(generation_request(request_id, prompt, GREEDY))
    tokens, logprobs, top, cached = [], [], [], 0
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens += delta.new_token_ids
            logprobs += delta.logprobs.logprobs
            top += delta.logprobs.top_logprobs
            cached = delta.num_cached_tokens or cached
    return (tokens, logprobs, top), cached


def shut(core: EngineCore) -> None:
    assert not core.handle(Shutdown(), [], [])


# int8: the 8-bit pool's blocks (models/kv_int8.py) carry their scales to disk.
@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_a_restarted_engine_reuses_a_prefix_from_disk_with_a_cold_runs_bits(
    row_invariant, tmp_path, kv
):
    rng = random.Random(5)
    prompt = random_prompt(rng, 150)
    cold, _ = run(disk_core(row_invariant, None, budget=37, kv_cache_dtype=kv), prompt)
    first = disk_core(row_invariant, tmp_path, budget=64, kv_cache_dtype=kv)
    run(first, prompt, "first")
    shut(first)  # its queued writes land
    second = disk_core(row_invariant, tmp_path, budget=16, kv_cache_dtype=kv)  # "restarted"
    restored, cached = run(second, prompt, "again")
    stats = second.stats().kv_tiers
    assert stats is not None and stats.disk_hits > 0 and cached == 148
    assert restored == cold


def test_a_damaged_cache_file_is_recomputed_not_used(row_invariant, tmp_path):
    rng = random.Random(6)
    prompt = random_prompt(rng, 100)
    cold, _ = run(disk_core(row_invariant, None), prompt)
    first = disk_core(row_invariant, tmp_path)
    run(first, prompt)
    shut(first)
    files = sorted(tmp_path.rglob("*.kvb"))
    for path in files[::3]:
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    second = disk_core(row_invariant, tmp_path)
    again, _ = run(second, prompt)
    assert again == cold
    stats = second.stats().kv_tiers
    assert stats is not None and stats.disk_bad_files >= 1


def test_another_dtype_finds_nothing_in_the_same_folder(row_invariant, tiny_loaded, tmp_path):
    prompt = random_prompt(random.Random(8), 60)
    first = disk_core(row_invariant, tmp_path)
    run(first, prompt)
    shut(first)
    other = disk_core(replace(tiny_loaded, max_model_len=256), tmp_path)  # float32 weights
    _, cached = run(other, prompt)
    assert cached == 0


def test_an_int8_kv_engine_finds_nothing_a_bf16_kv_engine_wrote(row_invariant, tmp_path):
    prompt = random_prompt(random.Random(8), 60)
    first = disk_core(row_invariant, tmp_path)
    run(first, prompt)
    shut(first)
    _, cached = run(disk_core(row_invariant, tmp_path, kv_cache_dtype="int8"), prompt)
    assert cached == 0


def test_two_engines_on_one_folder_give_cold_bits(row_invariant, tmp_path):
    rng = random.Random(9)
    prompts = [random_prompt(rng, rng.randrange(20, 120)) for _ in range(4)]
    cold = [run(disk_core(row_invariant, None), p)[0] for p in prompts]
    engines = [disk_core(row_invariant, tmp_path), disk_core(row_invariant, tmp_path)]
    for round_ in range(2):
        for i, prompt in enumerate(prompts):
            engine = engines[(i + round_) % 2]
            assert run(engine, prompt, f"{round_}-{i}")[0] == cold[i]
            assert engine.tiers is not None and engine.tiers.disk is not None
            engine.tiers.disk.flush()
    for engine in engines:
        shut(engine)


def test_the_fingerprint_ignores_how_the_kernel_plan_came():
    from sluice.engine.kv_tier_setup import plan_choices

    measured = "kernel plan (measured at load): prefill attention native at every length"
    assert plan_choices(measured) == plan_choices(measured.replace("measured at load", "cached"))
    assert plan_choices(measured) != plan_choices(measured.replace("native", "torch"))


def test_the_fingerprint_names_the_kv_dtype_even_at_equal_block_bytes(row_invariant, tmp_path):
    from sluice.engine.kv_tier_setup import disk_fingerprint

    def fingerprint(kv: str) -> bytes:
        config = EngineConfig(cache=CacheConfig(kv_cache_dtype=kv))
        return disk_fingerprint(config, row_invariant, torch.bfloat16, block_bytes=4096)

    assert fingerprint("auto") == fingerprint("bf16")  # the same pool: auto is bf16 here
    assert fingerprint("auto") != fingerprint("int8")
