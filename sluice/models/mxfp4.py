"""MXFP4 (OCP microscaling FP4) weights dequantized: `dequantize_mxfp4`.

gpt-oss's release stores each expert matrix as `*_blocks` [..., G, 16]
uint8, two 4-bit E2M1 values a byte (low nibble first), and `*_scales`
[..., G] uint8, one power of two (E8M0: 2 ** (scale - 127)) per group of 32
values along the input dim. Dequantized, they are [..., G * 32] in the
checkpoint's [out, in] order, exactly: every E2M1 value times a power of two
is a float32 (and, within bfloat16's exponent range, a bfloat16).

A checkpoint's MXFP4 stacks take 4.25 bits a weight in its files, and as
much in memory where the native kernel keeps them (mxfp4_experts.py), else
the model dtype's bits once dequantized: the memory plan asks `growth_bytes`.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from sluice.errors import ModelLoadError
from sluice.models.native.mxfp4 import mxfp4_available

# The 16 E2M1 codes: sign bit 3, then 2 exponent bits and 1 mantissa bit.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # fmt: skip
BYTES_PER_BLOCK = 16  # 32 values


def kept_format(config_json: dict) -> str | None:
    """The experts' format where a checkpoint's come in MXFP4 (its
    `quantization_config` says "mxfp4": OpenAI's gpt-oss release) and stay so
    (the native kernel runs here): "MXFP4"; else None (dequantized, or none)."""
    quantization = config_json.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    return "MXFP4" if method == "mxfp4" and mxfp4_available() else None


def dequantize_mxfp4(
    name: str, blocks: Tensor, scales: Tensor
) -> Tensor:  # [..., G, 16] uint8, [..., G] uint8 -> [..., G * 32] float32
    """The values the blocks and scales of tensor `name` hold; ModelLoadError
    (one line) where their shapes or dtypes do not pair."""
    check_pair(name, blocks, scales)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    values = torch.empty(*blocks.shape[:-1], 2 * BYTES_PER_BLOCK, dtype=torch.float32)
    values[..., 0::2] = table[(blocks & 0x0F).long()]
    values[..., 1::2] = table[(blocks >> 4).long()]
    exponents = scales.to(torch.int32).sub_(127).unsqueeze(-1)  # [..., G, 1]
    return torch.ldexp(values, exponents).flatten(-2)


def check_pair(name: str, blocks: Tensor, scales: Tensor) -> None:
    """ModelLoadError (one line) where an MXFP4 tensor's blocks and scales do not pair."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ModelLoadError(
            f"MXFP4 tensor {name} needs uint8 blocks and scales, got {blocks.dtype} and "
            f"{scales.dtype}"
        )
    if blocks.dim() < 2 or blocks.shape[-1] != BYTES_PER_BLOCK or blocks.shape[:-1] != scales.shape:
        raise ModelLoadError(
            f"MXFP4 tensor {name}: blocks {tuple(blocks.shape)} and scales "
            f"{tuple(scales.shape)} do not pair ([..., G, 16] and [..., G])"
        )


def growth_bytes(files: list[Path], dtype: torch.dtype) -> int:
    """How many bytes more than the files hold the MXFP4 stacks in `files`
    take once loaded: none where the kernel keeps them in 4 bits
    (mxfp4_experts.py), else dequantized into `dtype` (their `*_blocks` read
    from the safetensors headers only: each byte becomes two values)."""
    if mxfp4_available():
        return 0
    return stored_bytes(files, ("_blocks",)) * (2 * dtype.itemsize - 1)


def stored_bytes(files: list[Path], suffixes: tuple[str, ...] = ("_blocks", "_scales")) -> int:
    """The bytes of the MXFP4 tensors (names ending in `suffixes`) in `files`,
    from the safetensors headers only."""
    total = 0
    for path in files:
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), framework="pt") as checkpoint:
                for name in checkpoint.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    if name.endswith(suffixes):
                        total += math.prod(checkpoint.get_slice(name).get_shape())
        except (SafetensorError, OSError):
            continue  # unreadable: the weights' reader reports it, naming the file
    return total
