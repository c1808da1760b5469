"""A GGUF's tensors under HF names, read from the file itself (memory-mapped).

`gguf_weights` yields each tensor as the model loads it: a matrix in a block
type the native kernel keeps (loader/gguf_blocks.py: Q4_0/1, Q5_0/1, Q8_0,
Q4_K, Q5_K, Q6_K) as its `BlockCodes` (a stack of experts, `ffn_*_exps`,
as each expert's codes: models/moe_blocks.py keeps them; gpt-oss's stacks in
OpenAI's release layout, MXFP4 kept: loader/gguf_mxfp4.py), everything else (norms, biases,
float matrices, block types without a kernel) dequantized to float32, in
HF's layout and orientation either way. Nothing is written to disk: the
file is the weights' only copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader

from sluice.loader.gguf_blocks import FORMATS, BlockCodes, decode_blocks
from sluice.loader.gguf_llama import (
    family,
    hf_array,
    model_tensors,
    per_expert,
    restorer,
    unpermute_rope_rows,
)
from sluice.loader.gguf_mxfp4 import is_expert_stack, release_experts, release_name

Weight = torch.Tensor | BlockCodes


def gguf_weights(reader: GGUFReader, config: dict[str, Any]) -> Iterator[tuple[str, Weight]]:
    """(HF name, float32 tensor or block codes) for every tensor of the GGUF."""
    gguf = family(reader).gguf
    assert gguf is not None, "the registry finds only families with a GGUF layout"
    experts = []  # a release_experts family's stacks (gpt-oss), read last
    for tensor, gguf_name, heads in model_tensors(reader, config):
        name = release_name(gguf_name) if gguf.release_experts else gguf_name
        if gguf.release_experts and is_expert_stack(name):
            experts.append((tensor, name))
        elif restorer(gguf, name, config) is not None:  # the family's values, float32
            yield name, torch.from_numpy(hf_array(tensor, name, heads, gguf, config).copy())
        elif keeps_blocks(tensor, name):
            codes = decode_blocks(tensor.data, tensor.tensor_type.name, int(tensor.shape[0]))
            yield name, codes if heads is None else permuted_rows(codes, heads)
        elif keeps_expert_blocks(tensor, name):
            yield from expert_codes(tensor, name)
        else:  # a copy: an F32 tensor's array is a view of the read-only map
            for hf_name, array in per_expert(name, hf_array(tensor, name, heads, gguf, config)):
                yield hf_name, torch.from_numpy(array.copy())
    for hf_name, array in release_experts(experts, gguf):  # MXFP4 ones stay in 4 bits
        yield hf_name, torch.from_numpy(array)


def keeps_blocks(tensor: Any, hf_name: str) -> bool:
    """Whether a tensor loads as block codes: a 2-D weight in a kept block type."""
    return (
        tensor.tensor_type.name in FORMATS
        and len(tensor.shape) == 2
        and hf_name.endswith(".weight")
        and not hf_name.endswith("norm.weight")
        and not hf_name.endswith("mlp.gate.weight")  # a router: float32 (moe.py)
    )


def keeps_expert_blocks(tensor: Any, hf_name: str) -> bool:
    """Whether a stack of experts ([E, out, in]) loads as each expert's block codes."""
    return (
        tensor.tensor_type.name in FORMATS
        and len(tensor.shape) == 3
        and ".mlp.experts." in hf_name
        and hf_name.endswith(".weight")
    )


def expert_codes(tensor: Any, hf_name: str) -> Iterator[tuple[str, BlockCodes]]:
    """(HF name of expert M's matrix, its block codes) for every expert of a stack,
    decoded one expert at a time from the memory-mapped bytes."""
    num_experts, cols = int(tensor.shape[2]), int(tensor.shape[0])
    per_expert_bytes = np.asarray(tensor.data).reshape(num_experts, 1, -1)  # a view of the map
    for name, raw in per_expert(hf_name, per_expert_bytes):
        yield name, decode_blocks(raw, tensor.tensor_type.name, cols)


def permuted_rows(codes: BlockCodes, num_heads: int) -> BlockCodes:
    """`codes` with llama.cpp's q/k row permutation undone (rows move whole)."""
    rows = codes.q.shape[0]
    order = unpermute_rope_rows(np.arange(rows)[:, None], num_heads)[:, 0]

    def take(a):
        return None if a is None else np.ascontiguousarray(a[order])

    return BlockCodes(
        codes.format, take(codes.q), take(codes.scales), take(codes.mins), take(codes.d),
        take(codes.m),
    )  # fmt: skip
