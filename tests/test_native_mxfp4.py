"""The int8 x MXFP4 kernel (native/mxfp4_gemm.c through native/mxfp4.py):
bit for bit the arithmetic its header states (computed here in numpy
float32), a row's bits the same in any batch, bfloat16 in and out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sluice.models.mxfp4 import E2M1_VALUES, dequantize_mxfp4
from sluice.models.native.mxfp4 import mxfp4_available, mxfp4_groups, mxfp4_matmul

pytestmark = pytest.mark.skipif(not mxfp4_available(), reason="needs the native library")


def random_matrix(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, cols // 32, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 132, (rows, cols // 32), dtype=torch.uint8, generator=g)
    return blocks, scales


def numpy_reference(x: np.ndarray, blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The header's arithmetic in float32: int8 x per group of 32, exact integer
    sums with the doubled E2M1 values, one float step per group in order."""
    doubled = np.array(E2M1_VALUES, dtype=np.float32) * 2
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    w = doubled[codes].astype(np.int64)  # [n, G, 32]
    rows, groups = x.shape[0], blocks.shape[1]
    out = np.zeros((rows, blocks.shape[0]), dtype=np.float32)
    step = np.ldexp(np.float32(1), scales.astype(np.int32) - 128).astype(np.float32)  # [n, G]
    for t in range(rows):
        xg = x[t].reshape(groups, 32)
        amax = np.abs(xg).max(-1)
        inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, np.float32(1e-30)), 0)
        xq = np.clip(np.rint(xg * inv.astype(np.float32)[:, None]), -127, 127).astype(np.int64)
        sx = (amax / np.float32(127)).astype(np.float32)
        acc = np.zeros(blocks.shape[0], dtype=np.float32)
        for g in range(groups):
            total = (w[:, g] * xq[g]).sum(-1).astype(np.float32)  # [n], exact
            acc = acc + total * (sx[g] * step[:, g])
        out[t] = acc
    return out


def test_the_kernel_computes_its_stated_arithmetic_bit_for_bit():
    blocks, scales = random_matrix(37, 128, seed=0)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    x[2, 32:64] = 0  # an all-zero group: scale 0, no division
    ours = mxfp4_matmul(x, mxfp4_groups(blocks, scales))
    want = numpy_reference(x.numpy(), blocks.numpy(), scales.numpy())
    np.testing.assert_array_equal(ours.numpy(), want)


def test_it_is_close_to_the_dequantized_matmul():
    blocks, scales = random_matrix(64, 256, seed=2)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(3))
    ours = mxfp4_matmul(x, mxfp4_groups(blocks, scales))
    want = x @ dequantize_mxfp4("w", blocks, scales).T
    assert (ours - want).norm() < 0.02 * want.norm()  # int8 activations: about 0.6%


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_are_the_same_in_any_batch(dtype):
    blocks, scales = random_matrix(48, 192, seed=4)
    groups = mxfp4_groups(blocks, scales)
    x = torch.randn(40, 192, generator=torch.Generator().manual_seed(5)).to(dtype)
    whole = mxfp4_matmul(x, groups)
    assert whole.dtype == dtype
    for start, count in ((0, 1), (7, 1), (3, 5), (16, 17), (39, 1)):
        assert torch.equal(
            mxfp4_matmul(x[start : start + count], groups), whole[start : start + count]
        )


def test_bfloat16_output_is_the_float32_result_rounded_once():
    blocks, scales = random_matrix(20, 64, seed=6)
    groups = mxfp4_groups(blocks, scales)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    as_float = mxfp4_matmul(x.float(), groups)
    assert torch.equal(mxfp4_matmul(x, groups), as_float.bfloat16())


def test_a_strided_output_lands_in_its_columns():
    blocks, scales = random_matrix(16, 64, seed=8)
    groups = mxfp4_groups(blocks, scales)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(9))
    wide = torch.zeros(4, 40)
    mxfp4_matmul(x, groups, wide[:, 10:26])
    assert torch.equal(wide[:, 10:26], mxfp4_matmul(x, groups))
    assert not wide[:, :10].any() and not wide[:, 26:].any()
