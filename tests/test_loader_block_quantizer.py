"""Float matrices quantized into GGUF blocks (loader/block_quantizer.py): the
bytes a GGUF file would hold, read back by gguf-py within each format's error,
Q8_0 and Q4_0 bit for bit as gguf-py's own quantizer writes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from sluice.loader import block_quantizer
from sluice.loader.block_quantizer import quantize_rows
from sluice.loader.gguf_blocks import decode_blocks

# Relative squared error of Gaussian rows each format stays under (4, 4, 6, 8 bits).
WITHIN = {"Q4_0": 0.009, "Q5_0": 0.0025, "Q4_K": 0.0065, "Q6_K": 0.0006, "Q8_0": 0.00005}


def gaussian(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=generator) * 0.02


def relative_error(blocks: np.ndarray, kind: str, weight: torch.Tensor) -> float:
    values = quants.dequantize(blocks, GGMLQuantizationType[kind])
    reference = weight.float().numpy()
    return float(((values - reference) ** 2).mean() / (reference**2).mean())


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q5_0"])
def test_q8_0_q4_0_and_q5_0_are_bitwise_gguf_pys_quantizer(kind):
    weight = gaussian(48, 512, seed=1)
    ours = quantize_rows(weight, kind)
    assert np.array_equal(ours, quants.quantize(weight.numpy(), GGMLQuantizationType[kind]))


@pytest.mark.parametrize("kind", sorted(WITHIN))
def test_blocks_dequantize_by_gguf_py_to_within_the_formats_error(kind):
    weight = gaussian(64, 1024, seed=2)
    blocks = quantize_rows(weight, kind)
    assert relative_error(blocks, kind, weight) < WITHIN[kind]


@pytest.mark.parametrize("kind", sorted(WITHIN))
def test_the_loaders_decoding_of_the_blocks_is_gguf_pys(kind):
    blocks = quantize_rows(gaussian(32, 512, seed=3), kind)
    ours = decode_blocks(blocks, kind, 512).dequantize()
    assert np.array_equal(ours, quants.dequantize(blocks, GGMLQuantizationType[kind]))


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_each_value_is_within_half_a_step_plus_the_scales_rounding(kind):
    """A wrong nibble order or scale packing breaks this bound on most values."""
    weight = gaussian(16, 512, seed=4)
    values = quants.dequantize(quantize_rows(weight, kind), GGMLQuantizationType[kind])
    error = np.abs(values - weight.numpy()).reshape(-1, 32 if kind == "Q4_K" else 16)
    spread = np.ptp(weight.numpy().reshape(error.shape), axis=1, keepdims=True)
    levels = 15 if kind == "Q4_K" else 63
    assert (error <= spread / levels).mean() > 0.99


def test_the_q4_k_search_beats_the_plain_min_max_fit(monkeypatch):
    weight = gaussian(64, 1024, seed=5)
    searched = relative_error(quantize_rows(weight, "Q4_K"), "Q4_K", weight)
    monkeypatch.setattr(block_quantizer, "Q4_K_STEPS", 0)
    plain = relative_error(quantize_rows(weight, "Q4_K"), "Q4_K", weight)
    assert searched < plain


@pytest.mark.parametrize("kind", sorted(WITHIN))
def test_zero_and_constant_rows_come_back_exactly(kind):
    weight = torch.zeros(2, 256)
    weight[1] = 0.5
    values = quants.dequantize(quantize_rows(weight, kind), GGMLQuantizationType[kind])
    assert np.allclose(values, weight.numpy(), atol=0.5 / 2**10)


def test_bfloat16_rows_quantize_as_their_float32_values():
    weight = gaussian(8, 256, seed=6).to(torch.bfloat16)
    assert np.array_equal(quantize_rows(weight, "Q4_K"), quantize_rows(weight.float(), "Q4_K"))


def test_rows_of_partial_blocks_are_refused():
    with pytest.raises(ValueError, match="whole blocks"):
        quantize_rows(torch.zeros(2, 100), "Q4_K")
