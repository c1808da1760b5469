"""An HF checkpoint's matrices quantized into GGUF blocks at load (issue 41).

`--quantization q4_k_m` (the default for an HF checkpoint whose 4-bit size
reaches block_default's bound) and `q8_0` stream the safetensors tensors one
at a time from their memory map (loader/weights.iter_weights) and turn each
decoder matrix into the blocks a GGUF of that type would hold
(loader/block_quantizer.py), decoded into `BlockCodes` as a file's are: the
model then runs exactly the qblock path a GGUF gets (QBlockLinear, the fused
decode layer, QBlockEmbedding), int8 activations times the codes,
row-invariant. No float copy of the whole model is held and none is written.

Which matrix gets which type follows llama-quantize's Q4_K_M
(llama-quant.cpp): Q4_K everywhere but lm_head (or the tied embedding,
which is the head) in Q6_K, and v_proj and down_proj in Q6_K on the layers
`use_more_bits` picks (the first and last eighth, and every third between).
A row whose width is not whole 256-value super-blocks falls back as
llama-quantize does, Q4_K to Q5_0 and Q6_K to Q8_0 (32-value blocks), else
stays in floats (SmolLM2-135M's 576-wide rows: all but down_proj in Q5_0). `q8_0` puts every matrix in
Q8_0. Norms, biases and routers stay in floats.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from sluice.loader.block_quantizer import BLOCK_BYTES, BLOCK_VALUES, quantize_rows
from sluice.loader.gguf_blocks import BlockCodes, decode_blocks

Q4_K_M, Q8_0 = "q4_k_m", "q8_0"
HF_BLOCK_MODES = (Q4_K_M, Q8_0)


def hf_block_weights(
    weights: Iterable[tuple[str, torch.Tensor]], mode: str, config_json: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor | BlockCodes]]:
    """`weights` (HF name, float tensor) with each matrix `mode` quantizes as
    its block codes, one tensor at a time."""
    layers = int(config_json.get("num_hidden_layers", 0))
    tied = bool(config_json.get("tie_word_embeddings", False))
    for name, tensor in weights:
        kind = block_type(name, tuple(tensor.shape), mode, layers, tied)
        if kind is None:
            yield name, tensor
        else:
            yield name, decode_blocks(quantize_rows(tensor, kind), kind, int(tensor.shape[1]))


def block_type(name: str, shape: tuple[int, ...], mode: str, layers: int, tied: bool) -> str | None:
    """The GGUF type `mode` gives the HF tensor `name`, or None (kept in floats)."""
    if len(shape) != 2 or not name.endswith(".weight") or "norm" in name:
        return None
    if ".mlp.gate.weight" in name:  # a router: float32 on every path (moe.py)
        return None
    is_head = name == "lm_head.weight" or (tied and name == "model.embed_tokens.weight")
    if not (is_head or name == "model.embed_tokens.weight" or name.startswith("model.layers.")):
        return None
    wanted = Q8_0.upper() if mode == Q8_0 else _q4_k_m_type(name, layers, is_head)
    return _fitting(wanted, shape[1])


def _q4_k_m_type(name: str, layers: int, is_head: bool) -> str:
    if is_head:
        return "Q6_K"
    if (".v_proj." in name or ".down_proj." in name) and use_more_bits(_layer(name), layers):
        return "Q6_K"
    return "Q4_K"


def use_more_bits(layer: int, layers: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _layer(name: str) -> int:
    return int(name.split(".")[2])  # model.layers.{i}....


def _fitting(kind: str, cols: int) -> str | None:
    """`kind`, or llama-quant.cpp's fallback where rows are not whole
    super-blocks (Q4_K -> Q5_0, Q6_K -> Q8_0), or None (floats)."""
    if cols % BLOCK_VALUES[kind] == 0:
        return kind
    fallback = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}.get(kind)
    return fallback if fallback and cols % BLOCK_VALUES[fallback] == 0 else None


def parameter_count(files: list[Path]) -> int:
    """Values in the checkpoint, from the safetensors headers alone."""
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as checkpoint:
            for name in checkpoint.keys():  # noqa: SIM118 (safe_open is not a dict)
                shape = checkpoint.get_slice(name).get_shape()
                count = 1
                for size in shape:
                    count *= int(size)
                total += count
    return total


def four_bit_bytes(files: list[Path]) -> int:
    """About the bytes the checkpoint takes in Q4_K blocks (a Q4_K_M GGUF's
    size, give or take its Q6_K matrices): what block_default's bound reads."""
    return parameter_count(files) * BLOCK_BYTES["Q4_K"] // BLOCK_VALUES["Q4_K"]
