"""Put an execution plan to work: the one place a model's layers take their strategies.

gpt-fast's module swap. A load builds the model, fills it and gives its
matrices the forms the choices ask (weight-only copies, W8A8, GGUF blocks);
then it resolves the plan (measured on those weights or read from the plan
cache: nothing is rebound while measuring), then calls `apply` once. `apply`
gives every layer what the plan says it runs, in the order each part needs:

1. the matmul path per band: W8A8 only in the bands it won against AMX
   bfloat16 (`ExecutionPlan.w8a8_bands`; dropped where it won none);
2. the attention backend: every layer on paged attention takes the kernel
   plan's kernel per prefill length and for decode rows, and every W8A8
   matmul its int8 kernel per step size (`ExecutionPlan.kernels`);
3. fused decode: every layer that declares its decode step is the native
   chain (`decodes_as_native_chain`) gets its one native call, built last
   since it reads the decode attention kernel and the weights as they are now.

Nothing else rebinds a layer's attention, its matmuls' bands or its fused
decode call. The returned plan says how many layers decode fused.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import cast

from torch import nn

from sluice.models.attention import paged_attention
from sluice.models.execution_plan import ExecutionPlan
from sluice.models.fused_decode import fused_decode_for
from sluice.models.kernel_plan import KernelPlan
from sluice.models.linear import Linear, RowBands
from sluice.models.llama import LlamaDecoderLayer, LlamaForCausalLM


def apply(model: LlamaForCausalLM, plan: ExecutionPlan) -> ExecutionPlan:
    """Give `model`'s layers the strategies `plan` names (module docstring);
    `plan` with the number of layers that decode in one native call."""
    # 1. W8A8 where it won the race against AMX bfloat16.
    if plan.w8a8_bands is not None:
        _serve_w8a8_in(model, plan.w8a8_bands)
    # 2. Attention and int8 matmul kernels as measured (or read) for this CPU.
    if plan.kernels is not None:
        _use_kernels(model, plan.kernels)
    # 3. One native call per decode step where the layer is that chain.
    fused = 0
    for layer in _layers(model):
        layer.fused_decode = fused_decode_for(layer)
        fused += layer.fused_decode is not None
    return dataclasses.replace(plan, fused_decode_layers=(fused, len(model.layers)))


def _layers(model: LlamaForCausalLM) -> list[LlamaDecoderLayer]:
    return cast(list[LlamaDecoderLayer], list(model.layers))


def _w8a8_matrices(model: nn.Module) -> list[Linear]:
    return [
        module
        for module in model.modules()
        if isinstance(module, Linear) and module.int8_activations is not None
    ]


def _serve_w8a8_in(model: LlamaForCausalLM, bands: RowBands) -> None:
    """W8A8 in `bands` only, every other row count on the other paths; none
    left where the bands are empty."""
    for linear in _w8a8_matrices(model):
        linear.serve_int8_activations_in(bands)
    if not _w8a8_matrices(model):
        model.activation_quantization = None


def _use_kernels(model: LlamaForCausalLM, kernels: KernelPlan) -> None:
    """Prefill attention on the kernel `kernels` gives each length, decode
    attention on the one it names, int8 matmuls on the one it gives each step
    size; layers on another attention path (sliding windows, capped scores,
    batch-invariant mode) keep theirs."""
    for layer in _layers(model):
        if layer.attends_paged:
            layer.attend = functools.partial(paged_attention, kernels=kernels)
    for linear in _w8a8_matrices(model):
        assert linear.int8_activations is not None, "listed for its W8A8 layer"
        linear.int8_activations.serve_bands(kernels.int8_matmul)
