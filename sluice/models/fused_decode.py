"""A decoder layer in one native call for steps whose tokens all run as
decode rows (native/decode_layer.c): the kernels the layer's Python path
calls, in its order, with its roundings, so the same bits, without the ~11
Python calls between them per layer.

Which layers: those that declare their Python path for such a step is exactly
that chain (`LlamaDecoderLayer.decodes_as_native_chain`): Llama-shaped (no
q/k norm, RoPE on whole heads by the native kernel, the native SwiGLU and
RMSNorm), bfloat16, every matmul on the packed int8 kernel at every row count
(`runs_every_row_packed`: the row-invariant default) or kept in a GGUF's
blocks (QBlockLinear, `--quantization gguf`). Others, and steps with prefill
rows, keep the Python path. Bound once per load, by the execution plan's
apply (plan_apply.py), after the attention kernels: the weights' pointers and
the decode attention kernel are fixed then; the kernel plan's AMX bands are
read per call.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import torch
from torch import Tensor, nn

from sluice.models.attention import AttentionMetadata, decodes_on_amx
from sluice.models.linear import Linear
from sluice.models.native import _library
from sluice.models.native.abi import DecoderLayer, Int8Matrix, LayerMatrix
from sluice.models.qblock_linear import QBlockLinear
from sluice.models.rope_norm import Float32Angles


@functools.cache
def _decoder_layer_function():
    library = _library()
    return None if library is None else library.decoder_layer_rows_bf16


def runs_every_row_packed(linear: nn.Module) -> bool:
    """Whether `linear` runs one packed native matmul at every row count (the
    row-invariant W8A8 scheme, or a GGUF's blocks), as the chain does."""
    # A projection kept in GGUF blocks runs qblock_gemm at every row count.
    if isinstance(linear, QBlockLinear):
        return linear.bias is None
    if not isinstance(linear, Linear):
        return False
    int8 = linear.int8_activations
    return (
        int8 is not None
        and int8.packed is not None
        and linear.row_tile is None
        and linear.int8_row_bands == (range(1, sys.maxsize),)
    )


class FusedDecode:
    """One layer's native call (module docstring); the tensors it points at
    belong to the layer, which outlives it."""

    def __init__(self, layer: nn.Module, function) -> None:
        self._function = function
        linears = (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
        # W8A8 matrices' AMX bands, read per call; None for GGUF-block ones.
        self._int8 = tuple(getattr(linear, "int8_activations", None) for linear in linears)
        norms = (layer.attention_norm.weight, layer.mlp_norm.weight)
        assert all(w.is_contiguous() for w in norms)
        # The part arrays the structs point at live as long as this object.
        self._parts = [_qblock_parts(linear) for linear in linears]
        qkv, o, gate_up, down = (
            _layer_matrix(linear, parts) for linear, parts in zip(linears, self._parts, strict=True)
        )
        self._layer = DecoderLayer(
            norms[0].data_ptr(), norms[1].data_ptr(), qkv, o, gate_up, down,
            layer.input_layernorm.shape[0], layer.num_heads, layer.num_kv_heads, layer.head_dim,
            gate_up.int8.out_features // 2, layer.eps, layer.scale, int(decodes_on_amx(layer.attend, layer.head_dim)),
        )  # fmt: skip
        self._amx = (ctypes.c_int64 * 4)()

    def __call__(
        self, hidden: Tensor, rope: Float32Angles, kv_cache: Tensor, attn: AttentionMetadata
    ) -> None:  # hidden [T, hidden] updated in place
        rows = hidden.shape[0]
        plan = attn.decode
        amx = self._amx
        for i, int8 in enumerate(self._int8):
            amx[i] = 0 if int8 is None else int8.amx_min_rows_at(rows)
        _, num_blocks, block_size = kv_cache.shape[:3]
        status = self._function(
            ctypes.byref(self._layer), hidden.data_ptr(), rows, rope.cos.data_ptr(),
            rope.sin.data_ptr(), kv_cache.data_ptr(), num_blocks, block_size,
            attn.slot_mapping.data_ptr(), plan.block_ids.data_ptr(), plan.num_blocks,
            plan.seq_lens.data_ptr(), amx,
        )  # fmt: skip
        if status != 0:
            raise ValueError("decoder layer: a slot or block id outside the cache, or no memory")

    def serves(
        self, hidden: Tensor, rope: object, kv_cache: Tensor, attn: AttentionMetadata
    ) -> bool:
        """Whether this step's layer is the C chain: every token a decode row."""
        decode = attn.decode
        return (
            decode is not None
            and decode.token_indices is None
            and isinstance(rope, Float32Angles)
            and hidden.is_contiguous()
            and kv_cache.dtype == torch.bfloat16
            and kv_cache.is_contiguous()
            and attn.slot_mapping.is_contiguous()
            and decode.seq_lens.is_contiguous()
        )


def _layer_matrix(linear: nn.Module, parts: ctypes.Array | None) -> LayerMatrix:
    """The struct of one projection: its W8A8 matrix, or its GGUF-block parts."""
    if parts is not None:
        shape = Int8Matrix(out_features=linear.out_features, in_features=linear.in_features)
        return LayerMatrix(shape, len(parts), parts)
    int8 = linear.int8_activations
    packed = int8.packed
    bias = int8.bias
    matrix = Int8Matrix(
        packed.packed.data_ptr(), packed.compensation.data_ptr(), int8.weight_scales.data_ptr(),
        int8.inv_smooth.data_ptr(), 0 if bias is None else bias.data_ptr(),
        packed.out_features, packed.in_features, int(int8.pairs),
    )  # fmt: skip
    return LayerMatrix(matrix, 0, None)


def _qblock_parts(linear: nn.Module) -> ctypes.Array | None:
    """A QBlockLinear's parts as a C array (its packed tensors stay the module's)."""
    return linear.part_array if isinstance(linear, QBlockLinear) else None


def fused_decode_for(layer: nn.Module) -> FusedDecode | None:
    """The layer's native call where it declares its decode is the chain
    (`decodes_as_native_chain`) and the library is built; else None."""
    function = _decoder_layer_function()
    if function is None or not layer.decodes_as_native_chain():
        return None
    return FusedDecode(layer, function)
