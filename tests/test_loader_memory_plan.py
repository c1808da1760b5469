"""Memory planned at startup: the CPU KV budget and the refusals, on any machine's figures."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import pytest

from sluice.errors import ModelLoadError
from sluice.loader.memory_plan import (
    DEFAULT_CPU_KV_BYTES,
    RESERVE_BYTES,
    MemoryPlan,
    check_weights_fit,
    cpu_kv_budget,
    fitted_max_model_len,
    release_free_heap,
    workspace_bytes,
)
from sluice.models.families.registry import parse_hf_config
from tests.model_factory import build_tiny_model

GIB = 1 << 30
# Llama-3.2-1B's pool: 16 layers x 8 KV heads x 64 x K and V x bfloat16, blocks of 16.
BLOCK_1B = 16 * 8 * 64 * 2 * 2 * 16
# Llama-3.1-8B's: 32 layers x 8 x 128.
BLOCK_8B = 32 * 8 * 128 * 2 * 2 * 16


def test_the_default_pool_where_one_request_fits_in_it():
    budget = cpu_kv_budget(BLOCK_1B, 16, 8192, available_bytes=20 * GIB, workspace=GIB // 8)
    assert budget == DEFAULT_CPU_KV_BYTES


def test_a_long_context_gets_the_pool_of_one_full_request():
    # 131,072 tokens of the 1B model: 4 GiB, past the default.
    budget = cpu_kv_budget(BLOCK_1B, 16, 131072, available_bytes=20 * GIB, workspace=GIB // 8)
    assert budget == 131072 // 16 * BLOCK_1B == 4 * GIB


@pytest.mark.parametrize("available_gib", [4, 12, 17])
def test_a_pool_that_cannot_fit_is_refused_with_the_figures_and_what_fits(available_gib):
    available = available_gib * GIB
    with pytest.raises(ModelLoadError) as info:
        cpu_kv_budget(BLOCK_8B, 16, 131072, available_bytes=available, workspace=GIB // 4)
    message = str(info.value)
    assert "max_model_len 131072 needs 16.0 GiB" in message
    assert f"{available_gib:.1f} GiB of memory is available" in message
    # The suggested length fits what was left.
    suggested = int(message.split("--max-model-len ")[1].split()[0])
    usable = available - GIB // 4 - RESERVE_BYTES
    assert suggested // 16 * BLOCK_8B <= usable < (suggested // 16 + 1) * BLOCK_8B
    assert cpu_kv_budget(BLOCK_8B, 16, suggested, available, GIB // 4) <= usable


def test_an_unasked_context_that_does_not_fit_is_fitted_to_half_the_usable_memory():
    # An 8B file declaring 131,072 tokens (16 GiB of bf16 KV) on a machine with 13 GiB left.
    available, workspace = 13 * GIB, GIB // 4
    fitted = fitted_max_model_len(BLOCK_8B, 16, 131072, available, workspace)
    usable = available - workspace - RESERVE_BYTES
    assert fitted is not None and fitted % 1024 == 0
    assert fitted // 16 * BLOCK_8B <= usable // 2 < (fitted // 16 + 64) * BLOCK_8B
    # The fitted length then gets its pool without a refusal.
    assert cpu_kv_budget(BLOCK_8B, 16, fitted, available, workspace) >= fitted // 16 * BLOCK_8B


def test_nothing_is_fitted_where_the_models_limit_fits_or_not_even_the_minimum_does():
    assert fitted_max_model_len(BLOCK_1B, 16, 8192, 20 * GIB, GIB // 8) is None
    assert fitted_max_model_len(BLOCK_8B, 16, 131072, GIB * 3 // 2, 0) is None


def test_a_small_machine_gets_less_than_the_default_but_one_full_request():
    budget = cpu_kv_budget(BLOCK_1B, 16, 4096, available_bytes=GIB * 18 // 10, workspace=0)
    assert 4096 // 16 * BLOCK_1B <= budget < DEFAULT_CPU_KV_BYTES


def test_weights_larger_than_memory_are_refused_before_loading():
    check_weights_fit("llama-8b-Q4_K_M.gguf", int(4.6 * GIB), available_bytes=20 * GIB)
    with pytest.raises(ModelLoadError, match=r"needs about 18\.6 GiB .* 16\.0 GiB of memory"):
        check_weights_fit("qwen3-30b-a3b-Q4_K_M.gguf", int(18.6 * GIB), 16 * GIB)


def test_the_workspace_grows_with_the_step_and_the_line_names_each_part(tmp_path):
    config = parse_hf_config(build_tiny_model("llama_tied", tmp_path).config_dict)
    small = workspace_bytes(config, 64, 4, 2)
    assert workspace_bytes(config, 2048, 4, 2) > small > 0
    line = MemoryPlan(2501 << 20, 1 << 30, 96 << 20, 15 * GIB).describe()
    assert line == (
        "memory: weights 2501 MiB, KV 1024 MiB, workspace 96 MiB (15.0 GiB still available)"
    )


def test_a_cpu_pool_is_named_reserved_and_resident_as_used():
    line = MemoryPlan(2501 << 20, 1 << 30, 96 << 20, 15 * GIB, is_kv_resident_as_used=True)
    assert line.describe() == (
        "memory: weights 2501 MiB, KV reserved 1024 MiB (resident as used), workspace 96 MiB "
        "(15.0 GiB still available)"
    )


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_free_heap_pages_between_kept_chunks_go_back_to_the_system():
    # What a load leaves: chunks freed between chunks that stay, so the
    # heap's top cannot shrink and glibc keeps the freed pages resident.
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunk = 96 << 10  # under glibc's first mmap threshold: from the heap
    pointers = [libc.malloc(chunk) for _ in range(2048)]  # 192 MiB
    for pointer in pointers:
        ctypes.memset(pointer, 1, chunk)
    for pointer in pointers[::2]:
        libc.free(pointer)
    try:
        before = _resident_bytes()
        assert release_free_heap()
        assert before - _resident_bytes() > 64 << 20  # most of the 96 MiB freed
    finally:
        for pointer in pointers[1::2]:
            libc.free(pointer)
