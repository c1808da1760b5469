"""The AMX-BF16 prefill attention kernel (native/prefill_attention_amx.c).

Against float32 attention on the same bfloat16 inputs, within what torch's
own bfloat16 attention errs by: heads of 64 and 128, grouped-query (3 query
heads a KV head) and plain heads, whole prompts and chunks behind cached
context, lengths on and off its 16-query tiles and 64-key blocks. And the
property its fixed key blocks promise: a query's result does not depend on
how its prompt was cut into chunks, bit for bit. The model's prefill takes
it in the plan's AMX bands, cached context read back from the paged cache.

Skipped only where the CPU has no AMX-BF16; where it has and a compiler
exists, the kernel must be there (a failed build fails here).
"""

from __future__ import annotations

import pytest
import torch

from sluice.loader.choices import cpu_flags
from sluice.models import attention
from sluice.models.kernel_plan import AMX, NATIVE, KernelPlan
from sluice.models.native import find_compiler
from sluice.models.native.prefill import prefill_attention_amx_kernel
from tests.prefill_attention_cases import assert_as_close_as_torch, case

requires_amx = pytest.mark.skipif(
    find_compiler() is None or not {"amx_tile", "amx_bf16"} <= cpu_flags(),
    reason="no C compiler or no AMX-BF16 here",
)


@pytest.fixture
def kernel():
    kernel = prefill_attention_amx_kernel(torch.bfloat16)
    assert kernel is not None, "the CPU has AMX-BF16 but the kernel was not built or not granted"
    return kernel


@requires_amx
@pytest.mark.parametrize(
    ("num_queries", "num_keys"),
    [(1, 1), (15, 15), (33, 33), (100, 100), (517, 517), (1, 40), (15, 100), (33, 517)],
)
@pytest.mark.parametrize(
    ("heads", "head_dim"), [((9, 3), 64), ((4, 4), 64), ((6, 2), 128), ((2, 2), 128)]
)
def test_the_kernel_is_as_close_to_exact_as_torchs_bfloat16_attention(
    kernel, num_queries, num_keys, heads, head_dim
):
    assert_as_close_as_torch(kernel, num_queries, num_keys, heads, head_dim)


@requires_amx
@pytest.mark.parametrize("cuts", [(300, 400), (123, 577), (1, 64, 63, 572)])
@pytest.mark.parametrize(("heads", "head_dim"), [((9, 3), 64), ((2, 2), 128)])
def test_a_prompt_in_chunks_gets_the_bits_of_one_call(kernel, cuts, heads, head_dim):
    q, k, v = case(sum(cuts), sum(cuts), heads, head_dim, seed=sum(cuts))
    whole = kernel(q, k, v, 0.125)
    chunks, end = [], 0
    for length in cuts:  # each chunk attends to its own keys and all before them
        end += length
        chunks.append(kernel(q[end - length : end], k[:end], v[:end], 0.125))
    assert torch.equal(torch.cat(chunks), whole)


@requires_amx
@pytest.mark.parametrize("position", [0, 15, 16, 63, 64, 450, 699])
def test_a_query_alone_gets_the_bits_it_gets_among_others(kernel, position):
    q, k, v = case(700, 700, (9, 3), 64, seed=5)
    whole = kernel(q, k, v, 0.125)
    alone = kernel(q[position : position + 1], k[: position + 1], v[: position + 1], 0.125)
    assert torch.equal(alone[0], whole[position])


@requires_amx
def test_other_shapes_and_dtypes_get_no_kernel_or_an_error(kernel):
    assert prefill_attention_amx_kernel(torch.float32) is None
    q, k, v = case(4, 4, (4, 2), 96)
    with pytest.raises(ValueError, match="unsupported shape"):
        kernel(q, k, v, 0.1)
    q, k, v = case(4, 4, (4, 3), 64)  # 4 query heads do not share 3 KV heads
    with pytest.raises(ValueError, match="unsupported shape"):
        kernel(q, k, v, 0.1)


@requires_amx
def test_the_models_prefill_takes_it_where_the_plan_says_with_cached_context(kernel, monkeypatch):
    calls = []

    def counting(*args):
        calls.append(args[1].shape[0])  # keys seen
        return kernel(*args)

    monkeypatch.setattr(attention, "prefill_attention_amx_kernel", lambda dtype: counting)
    plan = KernelPlan(((0, NATIVE), (40, AMX)), "measured at load")
    q, k, v = case(50, 50, (9, 3), 64, seed=3)
    whole = attention._prefill_attention(
        q, k, v, None, attention.PrefillPlan(0, 50, 0, 50, None), 0.125, plan
    )
    assert calls == [50] and torch.equal(whole, kernel(q, k, v, 0.125))
    # The last 20 tokens behind 30 cached: keys read back from the paged cache.
    block_ids = torch.tensor([2, 0, 3, 1])
    kv_cache = torch.zeros(2, 4, 16, 3, 64, dtype=torch.bfloat16)
    for i, block in enumerate(block_ids.tolist()):
        kv_cache[0, block, : len(k[16 * i : 16 * i + 16])] = k[16 * i : 16 * i + 16]
        kv_cache[1, block, : len(v[16 * i : 16 * i + 16])] = v[16 * i : 16 * i + 16]
    chunk = attention.PrefillPlan(0, 20, context_len=30, seq_len=50, block_ids=block_ids)
    got = attention._prefill_attention(q[30:], k[30:], v[30:], kv_cache, chunk, 0.125, plan)
    assert calls == [50, 50] and torch.equal(got, whole[30:])
    calls.clear()
    short = attention.PrefillPlan(0, 30, 0, 30, None)
    attention._prefill_attention(q[:30], k[:30], v[:30], None, short, 0.125, plan)
    assert calls == []  # below 40 keys: the AVX512 kernel's band
