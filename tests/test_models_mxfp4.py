"""MXFP4 blocks dequantized (sluice/models/mxfp4.py): bit for bit what
transformers' gpt-oss loader computes, and one line for blocks and scales
that do not pair."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from sluice.errors import ModelLoadError
from sluice.models import mxfp4
from sluice.models.mxfp4 import dequantize_mxfp4, growth_bytes


def test_random_blocks_dequantize_to_transformers_values_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(100, 150, (3, 10, 4), dtype=torch.uint8, generator=g)
    ours = dequantize_mxfp4("w", blocks, scales)  # [E, out, in]
    reference = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    assert ours.shape == (3, 10, 128)
    assert torch.equal(ours, reference.transpose(1, 2))
    assert torch.equal(ours.signbit(), reference.transpose(1, 2).signbit())  # -0.0 kept


def test_a_byte_holds_two_values_low_nibble_first_scaled_by_a_power_of_two():
    blocks = torch.zeros(1, 16, dtype=torch.uint8)
    blocks[0, 0] = 0x9F  # low 0xF: -6.0, high 0x9: -0.5
    values = dequantize_mxfp4("w", blocks, torch.tensor([128], dtype=torch.uint8))  # 2 ** 1
    assert values[:2].tolist() == [-12.0, -1.0] and not values[2:].any()


@pytest.mark.parametrize(
    ("blocks", "scales", "message"),
    [
        (torch.zeros(2, 4, 16, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8),
         r"blocks \(2, 4, 16\) and scales \(2, 3\) do not pair"),
        (torch.zeros(2, 4, 8, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8),
         "do not pair"),
        (torch.zeros(2, 4, 16), torch.zeros(2, 4, dtype=torch.uint8), "needs uint8 blocks"),
    ],
)  # fmt: skip
def test_blocks_and_scales_that_do_not_pair_are_one_line(blocks, scales, message):
    with pytest.raises(ModelLoadError, match=message):
        dequantize_mxfp4("model.layers.0.mlp.experts.down_proj", blocks, scales)


def test_the_memory_plan_counts_blocks_at_two_values_a_byte_in_the_model_dtype(
    tmp_path, monkeypatch
):
    """Where the native kernel is not built, so the experts load dequantized."""
    monkeypatch.setattr(mxfp4, "mxfp4_available", lambda: False)
    blocks = torch.zeros(4, 8, 2, 16, dtype=torch.uint8)  # 1024 bytes: 2048 values
    save_file(
        {"e.down_proj_blocks": blocks, "e.down_proj_scales": torch.zeros(4, 8, 2, dtype=torch.uint8),
         "e.down_proj_bias": torch.zeros(4, 8)},
        str(tmp_path / "model.safetensors"),
    )  # fmt: skip
    files = [tmp_path / "model.safetensors"]
    assert growth_bytes(files, torch.bfloat16) == 2048 * 2 - 1024
    assert growth_bytes(files, torch.float32) == 2048 * 4 - 1024
    monkeypatch.setattr(mxfp4, "mxfp4_available", lambda: True)
    assert growth_bytes(files, torch.bfloat16) == 0  # kept in 4 bits: the file's bytes
