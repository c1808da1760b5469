"""The kernel plan a load runs with (kernel_plan.py): `--kernel-plan auto|measure|FILE`.

auto reads the plan kept for this CPU, kernels, versions and head shapes,
and measures (then keeps) one where none is kept; measure always measures
and keeps the new plan; FILE pins the plan a file holds. Where no native
prefill kernel can run (another dtype, heads other than 64 or 128, no
AVX512-BF16), there is nothing to measure: every prefill token is a row of
the native decode kernel (ROWS, chunk-blind), or, with no native kernels at
all (no compiler, SLUICE_NATIVE_KERNELS=0), torch at every length.
Where the model runs the row-invariant scheme on a CPU with AMX-INT8, the
plan also times its two int8 matmuls (`int8_candidates`).

The candidates are the chunk-blind attention families (kernel_plan.py):
the AVX512 pair, and the AMX pair where the CPU grants tiles; torch's
flash SDPA is only the reference they must agree with. They run on the
model's own head shapes (query and KV heads, head size), on random inputs
of each measured length: whole causal prompts, as the first chunk of a long
prompt is, and decode rows over the paged cache. Before timing, each native
kernel must agree with torch's attention (the AMX decode kernel with the
AVX512 one) within bfloat16 rounding, or its family is no candidate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sluice.models.attention import prefill_attention_torch
from sluice.models.decoder_config import DecoderConfig
from sluice.models.kernel_plan import (
    AMX,
    DECODE_KEYS,
    DECODE_ROWS,
    INT8_ROWS,
    NATIVE,
    PREFILL_LENGTHS,
    ROWS,
    TORCH,
    KernelPlan,
    measure_attention,
    measure_int8,
    measured_lengths,
    pinned_plan,
    plan_from_fields,
)
from sluice.models.linear import Linear
from sluice.models.llama import LlamaForCausalLM
from sluice.models.native import (
    decode_attention_amx_kernel,
    decode_attention_kernel,
    native_status,
)
from sluice.models.native.int8 import int8_gemm_kernels
from sluice.models.native.prefill import (
    HEAD_DIMS,
    prefill_attention_amx_kernel,
    prefill_attention_kernel,
)
from sluice.models.plan_cache import PlanStore

logger = logging.getLogger(__name__)

Candidate = Callable[[int], object]
# Native against torch on the same inputs: a few bfloat16 roundings of outputs of order 1.
_AGREEMENT = 0.05


@dataclass(frozen=True, slots=True)
class PrefillCandidates:
    """Causal attention over n tokens on the model's head shapes, each way."""

    native: Candidate  # native/prefill_attention.c
    sdpa: Candidate  # torch's flash SDPA: the reference, not a candidate (not chunk-blind)
    amx: Candidate | None  # native/prefill_attention_amx.c; None: no AMX tiles here


@dataclass(frozen=True, slots=True)
class Int8Candidates:
    """The row-invariant scheme's two int8 matmuls on one of the model's
    matrices, each over its first n rows of random activations."""

    amx: Candidate | None  # None where the CPU has no AMX-INT8
    vnni: Candidate


def plan_kernels(
    store: PlanStore, config: DecoderConfig, dtype: torch.dtype, max_model_len: int,
    int8: Int8Candidates | None = None, clock: Callable[[], float] = time.perf_counter,
) -> KernelPlan:  # fmt: skip
    """The plan `store` (the kept plan, or a pinned file: plan_cache.py)
    gives this model, measured (and recorded in `store`) where it holds
    none; `int8`: the int8 matmuls to choose between by step size, if any."""
    if store.pinned:
        return pinned_plan(store.pinned, store.kept)
    candidates = prefill_candidates(config, dtype)
    if isinstance(candidates, str) and int8 is None:
        return KernelPlan(((0, _without_prefill_kernel(dtype)),), candidates)
    if (kept := plan_from_fields(store.kept, store.source)) is not None:
        return kept
    lengths = measured_lengths(max_model_len)
    spreads: list[float] = []
    family = _without_prefill_kernel(dtype)
    if not isinstance(candidates, str):
        decode = decode_candidates(config, dtype)
        family = measure_attention(
            (candidates.native, decode[0]),
            None if candidates.amx is None or decode[1] is None else (candidates.amx, decode[1]),
            lengths, clock=clock, spreads=spreads,
        )  # fmt: skip
    int8_bands, seconds = (
        ((), ()) if int8 is None
        else measure_int8(int8.amx, int8.vnni, clock=clock, spreads=spreads)
    )  # fmt: skip
    decode_kernel = AMX if family == AMX else NATIVE
    plan = KernelPlan(((0, family),), "measured at load", int8_bands, seconds, decode_kernel)
    store.put(plan.to_fields(), spreads, "the kernel plan")
    return plan


def _without_prefill_kernel(dtype: torch.dtype) -> str:
    """Where no native prefill kernel runs: decode-kernel rows where that
    kernel runs (chunk-blind), else torch's flash attention."""
    return ROWS if decode_attention_kernel(dtype) is not None else TORCH


def prefill_candidates(config: DecoderConfig, dtype: torch.dtype) -> PrefillCandidates | str:
    """The kernels that run causal attention over n tokens on the model's
    head shapes; or why there is no native candidate."""
    if config.head_dim not in HEAD_DIMS or dtype != torch.bfloat16:
        return f"no native prefill kernel for {dtype} heads of {config.head_dim}"
    kernel = prefill_attention_kernel(dtype)
    if kernel is None:
        status = native_status()
        return status.describe() if not status.is_on else "no native prefill kernel: no AVX512-BF16"
    scale = config.head_dim**-0.5
    inputs: dict[int, tuple[torch.Tensor, ...]] = {}

    def case(n: int) -> tuple[torch.Tensor, ...]:
        if n not in inputs:
            generator = torch.Generator().manual_seed(n)
            heads = (config.num_attention_heads, config.num_key_value_heads)
            inputs[n] = tuple(
                torch.randn(n, h, config.head_dim, generator=generator).to(dtype)
                for h in (heads[0], heads[1], heads[1])
            )  # q [n, Hq, D], keys and values [n, Hkv, D]
        return inputs[n]

    def run(attention) -> Candidate:
        return lambda n: attention(*case(n), scale)

    sdpa = run(prefill_attention_torch)
    native = run(kernel)
    if (gap := _gap(native, sdpa)) > _AGREEMENT:
        logger.warning("the native prefill kernel differs from torch's by %.3g: not used", gap)
        return f"the native prefill kernel disagreed with torch by {gap:.3g}"
    amx_kernel = prefill_attention_amx_kernel(dtype)
    amx = None if amx_kernel is None else run(amx_kernel)
    if amx is not None and (amx_gap := _gap(amx, sdpa)) > _AGREEMENT:
        logger.warning("the AMX prefill kernel differs from torch's by %.3g: not used", amx_gap)
        amx = None
    return PrefillCandidates(native, sdpa, amx)


def _gap(kernel: Candidate, other: Candidate, n: int = min(PREFILL_LENGTHS)) -> float:
    """The largest difference of `kernel` from `other` at size n (for prefill,
    from torch's attention at the shortest length)."""
    return (kernel(n).float() - other(n).float()).abs().max().item()


def decode_candidates(
    config: DecoderConfig, dtype: torch.dtype
) -> tuple[Candidate, Candidate | None]:
    """Decode attention over the paged cache on the model's head shapes, n rows
    of one sequence of DECODE_KEYS keys: (native, AMX or None where the CPU
    grants no tiles or it disagrees with the native kernel). Asked only
    where a native prefill kernel runs (bfloat16, heads of 64 or 128)."""
    native, amx = decode_attention_kernel(dtype), decode_attention_amx_kernel(dtype)
    assert native is not None and config.head_dim in HEAD_DIMS, "a native prefill kernel runs"
    generator = torch.Generator().manual_seed(1)
    rows, block_size = max(DECODE_ROWS), 16
    num_blocks = (DECODE_KEYS + rows + block_size - 1) // block_size
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    cache = torch.randn(2, *shape, generator=generator).to(dtype)
    q = torch.randn(rows, config.num_attention_heads, config.head_dim, generator=generator)
    q = q.to(dtype)
    table = torch.randperm(num_blocks, generator=generator).repeat(rows, 1)
    lens = torch.arange(DECODE_KEYS, DECODE_KEYS + rows)
    scale = config.head_dim**-0.5

    def run(kernel) -> Candidate:
        return lambda n: kernel(q[:n], cache, table[:n], lens[:n], scale)

    if amx is not None and (gap := _gap(run(amx), run(native), rows)) > _AGREEMENT:
        logger.warning("the AMX decode kernel differs from the native one by %.3g: not used", gap)
        amx = None
    return run(native), None if amx is None else run(amx)


def int8_candidates(model: LlamaForCausalLM) -> Int8Candidates | None:
    """AMX (where the CPU has it) against VNNI on the middle layer's gate/up
    matrix, where the model runs the row-invariant scheme; else None."""
    gemm = int8_gemm_kernels()
    middle = model.layers[len(model.layers) // 2]
    # An MoE layer has no gate/up matrix (its experts keep the model dtype): its q/k/v.
    linear = getattr(middle, "gate_up_proj", middle.qkv_proj)
    if gemm is None or not isinstance(linear, Linear):  # a QBlockLinear: no int8 matmul
        return None
    layer = linear.int8_activations
    if layer is None or layer.packed is None or linear.min_large_rows != 1:
        return None
    weights = layer.packed
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(max(INT8_ROWS), weights.in_features, generator=generator).to(model.dtype)

    def run(amx_min_rows: int) -> Candidate:
        def matmul(n: int) -> torch.Tensor:
            return gemm.linear(x[:n], layer.inv_smooth, weights, layer.weight_scales, layer.bias,
                               layer.pairs, amx_min_rows=amx_min_rows)  # fmt: skip

        return matmul

    return Int8Candidates(amx=run(1) if gemm.has_amx else None, vnni=run(0))
