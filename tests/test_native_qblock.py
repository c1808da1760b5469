"""The GGUF-block kernel: llama.cpp's arithmetic, bit for bit, any row count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from sluice.loader.gguf_blocks import FORMATS, BlockCodes, decode_blocks
from sluice.models.native import native_status
from sluice.models.native.build import find_compiler
from sluice.models.native.qblock import (
    QBlockMatrix,
    part_array,
    qblock_available,
    qblock_matmul,
    qblock_matmul_parts,
    qblock_rows,
)
from tests.gguf_quants import quantized


def _has_vnni() -> bool:
    with open("/proc/cpuinfo") as info:
        flags = next((line for line in info if line.startswith("flags")), "").split()
    return {"avx512f", "avx512bw", "avx512_vnni"} <= set(flags)


def test_the_kernel_runs_where_it_should():
    # Skipping below would hide a broken build: where a compiler and VNNI are
    # there, the kernel must be on.
    if find_compiler() is None or not _has_vnni():
        pytest.skip("no C compiler or no AVX512-VNNI: the 4-bit path is refused here")
    assert native_status().is_on, native_status().why_off
    assert qblock_available()


requires_kernel = pytest.mark.skipif(
    not (find_compiler() and _has_vnni()), reason="needs a C compiler and AVX512-VNNI"
)


def exact_reference(x: np.ndarray, codes: BlockCodes) -> np.ndarray:
    """The kernel's arithmetic in numpy: int8 activations per super-block,
    exact integer sums, then per super-block sx * (D * A - M * B), float32."""
    fmt = codes.format
    rows, k = x.shape
    n = codes.q.shape[0]
    size, sub = fmt.super_block, fmt.sub_block
    blocks = x.reshape(rows, k // size, size)
    amax = np.abs(blocks).max(-1)  # [rows, S]
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    sx = (amax / np.float32(127)).astype(np.float32)
    xq = np.clip(np.rint(blocks * inv[..., None]), -127, 127).astype(np.int64)
    xq = xq.reshape(rows, k // sub, sub)
    xsum = xq.sum(-1)  # [rows, J]
    isum = np.einsum("rjs,njs->rnj", xq, codes.q.astype(np.int64).reshape(n, k // sub, sub))
    t = isum - fmt.offset * xsum[:, None, :]  # [rows, n, J]
    scales = 1 if codes.scales is None else codes.scales.astype(np.int64)
    per_super = (rows, n, k // size, size // sub)
    a = np.broadcast_to(scales * t, (rows, n, k // sub)).reshape(per_super).sum(-1)
    out = np.zeros((rows, n), np.float32)
    for s in range(k // size):
        v = codes.d.astype(np.float32)[None, :, s] * a[:, :, s].astype(np.float32)
        if fmt.has_min:
            mins = 1 if codes.mins is None else codes.mins.astype(np.int64)
            b = np.broadcast_to(mins * xsum[:, None, :], (rows, n, k // sub))
            b = b.reshape(per_super).sum(-1)
            v = v - codes.m.astype(np.float32)[None, :, s] * b[:, :, s].astype(np.float32)
        out = out + v * sx[:, None, s]
    return out


def problem(name: str, n: int, k: int, rows: int, seed: int = 0):
    codes = decode_blocks(quantized(name, n, k, seed), name, k)
    x = np.random.default_rng(seed + 1).standard_normal((rows, k)).astype(np.float32)
    x[0, :7] = 0.0  # a partly empty block
    return codes, QBlockMatrix.from_codes(codes), x


@requires_kernel
@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize(("n", "k", "rows"), [(37, 512, 9), (16, 256, 1), (1, 1024, 5)])
def test_the_kernel_gives_the_exact_arithmetics_bits(name, n, k, rows):
    codes, matrix, x = problem(name, n, k, rows)
    got = qblock_matmul(torch.from_numpy(x), matrix).numpy()
    assert np.array_equal(got, exact_reference(x, codes))


@requires_kernel
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q5_1"])
def test_a_rows_bits_are_the_same_alone_and_among_others(name):
    # 70 rows cross the kernel's groups of 4 and chunks of 64.
    _, matrix, x = problem(name, 45, 512, 70, seed=5)
    together = qblock_matmul(torch.from_numpy(x), matrix)
    for start, count in [(0, 1), (3, 2), (17, 6), (60, 10), (69, 1)]:
        alone = qblock_matmul(torch.from_numpy(x[start : start + count]), matrix)
        assert torch.equal(alone, together[start : start + count]), (start, count)


@requires_kernel
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q4_1"])
@pytest.mark.parametrize("n", [16, 32, 48, 80, 112])
def test_a_rows_bits_do_not_depend_on_the_rows_and_tiles_blocked_with_it(name, n):
    # The kernel runs rows 4 at a time times tiles 2 at a time (one tile
    # where a count is odd), rows left over 4 tiles at a time: every row
    # count 1-9 against the one-row calls.
    _, matrix, x = problem(name, n, 512, 9, seed=11)
    singles = torch.cat([qblock_matmul(torch.from_numpy(x[i : i + 1]), matrix) for i in range(9)])
    for rows in range(1, 10):
        got = qblock_matmul(torch.from_numpy(x[:rows]), matrix)
        assert torch.equal(got, singles[:rows]), rows


@requires_kernel
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
@pytest.mark.parametrize(("n", "rows"), [(64, 1), (100, 1), (120, 2), (200, 3), (136, 5)])
def test_rows_left_over_from_groups_of_four_run_four_tiles_at_once_with_the_same_bits(
    name, n, rows
):
    # A work item is four tiles: rows outside a group of four take them all at
    # once (one row: every format; up to three: Q4/Q8) or two at a time,
    # and the matrix's last item has 1-3 tiles (n = 100: 7 tiles, 200: 13).
    codes, matrix, x = problem(name, n, 256, rows, seed=3)
    got = qblock_matmul(torch.from_numpy(x), matrix).numpy()
    assert np.array_equal(got, exact_reference(x, codes))


@requires_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parts_in_one_call_equal_each_part_alone(dtype):
    # A Q4_K_M attention mixes Q4_K and Q6_K (one quantization of the rows
    # serves both); Q8_0's 32-value blocks need a second one.
    names, widths = ["Q4_K", "Q6_K", "Q8_0", "Q4_K"], [32, 20, 16, 45]
    matrices = [
        problem(name, n, 512, 1, seed=i)[1]
        for i, (name, n) in enumerate(zip(names, widths, strict=True))
    ]
    x = torch.from_numpy(problem("Q4_K", 1, 512, 6, seed=9)[2]).to(dtype)
    wide = torch.full((6, sum(widths) + 3), 7.0, dtype=dtype)
    out = qblock_matmul_parts(x, part_array(matrices), wide[:, :-3])  # rows strided
    alone = torch.cat([qblock_matmul(x, matrix) for matrix in matrices], dim=1)
    assert torch.equal(out, alone) and bool((wide[:, -3:] == 7).all())
    for row in range(6):
        one = torch.empty((1, sum(widths)), dtype=dtype)
        qblock_matmul_parts(x[row : row + 1], part_array(matrices), one)
        assert torch.equal(one, alone[row : row + 1]), row


@requires_kernel
def test_the_product_is_close_to_the_float_one():
    codes, matrix, x = problem("Q4_K", 64, 2048, 4)
    dense = x @ codes.dequantize().T
    got = qblock_matmul(torch.from_numpy(x), matrix).numpy()
    # int8 activations, as llama.cpp's: about 1% of the largest output.
    assert np.abs(got - dense).max() < 0.02 * np.abs(dense).max()


@requires_kernel
def test_bfloat16_rows_round_the_float_result_once():
    codes, matrix, x = problem("Q4_K", 40, 512, 3)
    x16 = torch.from_numpy(x).to(torch.bfloat16)
    got = qblock_matmul(x16, matrix)
    assert got.dtype == torch.bfloat16
    want = qblock_matmul(x16.float(), matrix).to(torch.bfloat16)
    assert torch.equal(got, want)


@requires_kernel
def test_an_output_slice_is_written_in_place_and_nothing_else():
    _, matrix, x = problem("Q6_K", 20, 256, 3)
    wide = torch.full((3, 50), 7.0)
    qblock_matmul(torch.from_numpy(x), matrix, out=wide[:, 10:30])
    assert torch.equal(wide[:, 10:30], qblock_matmul(torch.from_numpy(x), matrix))
    assert bool((wide[:, :10] == 7).all()) and bool((wide[:, 30:] == 7).all())


@requires_kernel
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_rows_read_back_are_the_files_values(name):
    raw = quantized(name, 37, 512, seed=2)
    matrix = QBlockMatrix.from_codes(decode_blocks(raw, name, 512))
    expected = quants.dequantize(raw, getattr(GGMLQuantizationType, name)).reshape(37, 512)
    ids = torch.tensor([36, 0, 16, 15, 5, 5])
    assert np.array_equal(qblock_rows(matrix, ids).numpy(), expected[ids.numpy()])
    every_row = qblock_rows(matrix, torch.arange(matrix.out_features)).numpy()
    assert np.array_equal(every_row, expected)


@requires_kernel
def test_a_row_id_out_of_range_is_refused():
    _, matrix, _ = problem("Q4_0", 5, 256, 1)
    with pytest.raises(IndexError, match="outside"):
        qblock_rows(matrix, torch.tensor([5]))
