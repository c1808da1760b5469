"""The int8 matmuls of the row-invariant scheme (issue 28) give exact bits.

- A8 (one int8 code per activation) and A13 (codes in [-8191, 8191], each
  fed to the int8 matmul as a high and a low int8 row) through the native
  layer equal an exact integer product scaled in the shared epilogue's
  order (int8_epilogue.h), bit for bit, at row counts across the kernel's
  6-row groups and 192-row blocks and column counts off its 64-column tiles;
- every row's bits are the same alone as among any number of other rows;
- A13 is much closer to the float product than A8 (what it is for);
- on a CPU with AMX-INT8, the AMX kernel (int8_amx.c) gives the VNNI
  kernel's bits at every row count, column count and K, A8 and A13, with
  and without bias (K off whole 64-byte tiles: VNNI underneath), and a row
  alone equals the same row among others whichever kernel each call takes.
  Where /proc/cpuinfo says AMX and a compiler exists, the AMX kernel must
  be there: these tests fail, not skip, if it is not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sluice.models.native import _library, find_compiler
from sluice.models.native.int8 import AMX_MIN_ROWS, int8_gemm_kernels

gemm = int8_gemm_kernels()
requires_gemm = pytest.mark.skipif(gemm is None, reason="no AVX512-VNNI int8 kernel here")


def cpu_has_amx_int8() -> bool:
    """The first core's flags line lists amx_tile and amx_int8."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return {"amx_tile", "amx_int8"} <= set(flags.partition(":")[2].split())


# No library by choice (SLUICE_NATIVE_KERNELS=0) or for want of a compiler:
# skipped; a library that failed to build, or one without the AMX kernel on
# a CPU with AMX, fails (the `amx_gemm` fixture).
requires_amx = pytest.mark.skipif(
    find_compiler() is None
    or os.environ.get("SLUICE_NATIVE_KERNELS", "1") == "0"
    or not cpu_has_amx_int8(),
    reason="no AMX-INT8, no C compiler, or native kernels off",
)


def exact_reference(x, inv_smooth, w, col_scales, bias, pairs: bool):
    """The scheme in plain torch: exact integer sums (float64 holds them), then
    (sum) * row_scale * col_scale in float32, rounded once, then the bias."""
    v = x.float() * inv_smooth
    top = v.abs().amax(dim=1)
    max_code = 8191 if pairs else 127
    scales = torch.where(top > 0, top / max_code, torch.ones_like(top))
    codes = (v * (1 / scales)[:, None]).round().clamp(-max_code, max_code)
    if pairs:
        high = torch.floor((codes + 64) / 128)
        low = codes - 128 * high
        assert high.abs().max() <= 64 and low.min() >= -64 and low.max() <= 63
        sums = (high.double() @ w.double().T).float() * 128 + (low.double() @ w.double().T).float()
    else:
        sums = (codes.double() @ w.double().T).float()
    out = (sums * scales[:, None] * col_scales).to(torch.bfloat16)
    return out if bias is None else out + bias


def problem(rows: int, out_features: int, in_features: int = 576, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8,
                      generator=generator)  # fmt: skip
    x = torch.randn(rows, in_features, generator=generator)
    x[:, 5] *= 30  # an outlier column
    col_scales = torch.rand(out_features, generator=generator) * 1e-3
    inv_smooth = torch.rand(in_features, generator=generator) + 0.5
    return x.to(torch.bfloat16), inv_smooth, w, col_scales


@requires_gemm
@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 12, 97, 193, 400])
@pytest.mark.parametrize("out_features", [64, 200])
def test_the_native_layer_gives_the_exact_schemes_bits(pairs, rows, out_features):
    x, inv_smooth, w, col_scales = problem(rows, out_features, seed=rows)
    bias = torch.randn(out_features).to(torch.bfloat16) if rows % 2 else None
    packed = gemm.pack(w)
    got = gemm.linear(x, inv_smooth, packed, col_scales, bias, pairs)
    want = exact_reference(x, inv_smooth, w, col_scales, bias, pairs)
    assert torch.equal(got, want)


@requires_gemm
@pytest.mark.parametrize("pairs", [False, True])
def test_a_rows_bits_are_the_same_alone_and_among_others(pairs):
    x, inv_smooth, w, col_scales = problem(300, 136, seed=3)
    packed = gemm.pack(w)
    together = gemm.linear(x, inv_smooth, packed, col_scales, None, pairs)
    for start, count in ((0, 1), (7, 1), (299, 1), (10, 5), (100, 64), (0, 193)):
        alone = gemm.linear(x[start : start + count], inv_smooth, packed, col_scales, None, pairs)
        assert torch.equal(alone, together[start : start + count]), (start, count)


@requires_gemm
def test_a13_is_far_closer_to_the_float_product_than_a8():
    x, inv_smooth, w, col_scales = problem(32, 128, seed=5)
    packed = gemm.pack(w)
    exact = ((x.float() * inv_smooth) @ w.float().T) * col_scales
    errors = {
        pairs: (gemm.linear(x, inv_smooth, packed, col_scales, None, pairs).float() - exact)
        .abs()
        .mean()
        for pairs in (False, True)
    }
    assert errors[True] * 10 < errors[False]


@pytest.fixture
def amx_gemm():
    """The kernels, required to have AMX here (the CPU says it has it)."""
    assert gemm is not None and gemm.has_amx, "the CPU has AMX-INT8 but the kernel is not there"
    return gemm


AMX_ROWS = (1, 15, 16, 17, 31, 33, 100, 193, 511, 2049)


@requires_amx
@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("out_features", [64, 200, 576])
@pytest.mark.parametrize("in_features", [576, 1536, 100 * 4])
def test_the_amx_kernel_gives_the_vnni_kernels_bits(amx_gemm, pairs, out_features, in_features):
    x, inv_smooth, w, col_scales = problem(max(AMX_ROWS), out_features, in_features, seed=7)
    bias = torch.randn(out_features).to(torch.bfloat16)
    packed = amx_gemm.pack(w)
    for rows in AMX_ROWS:
        for b in (None, bias):
            args = (x[:rows], inv_smooth, packed, col_scales, b, pairs)
            vnni = amx_gemm.linear(*args)
            amx = amx_gemm.linear(*args, amx_min_rows=1)
            assert torch.equal(amx, vnni), (rows, b is None)


@requires_amx
@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("amx_min_rows", [1, AMX_MIN_ROWS])
def test_a_rows_bits_are_the_same_alone_and_among_others_with_amx(amx_gemm, pairs, amx_min_rows):
    x, inv_smooth, w, col_scales = problem(300, 200, 1536, seed=11)
    packed = amx_gemm.pack(w)
    together = amx_gemm.linear(x, inv_smooth, packed, col_scales, None, pairs,
                               amx_min_rows=amx_min_rows)  # fmt: skip
    for start, count in ((0, 1), (7, 1), (299, 1), (10, 5), (100, 64), (3, 33), (0, 193)):
        alone = amx_gemm.linear(x[start : start + count], inv_smooth, packed, col_scales, None,
                                pairs, amx_min_rows=amx_min_rows)  # fmt: skip
        assert torch.equal(alone, together[start : start + count]), (start, count)


@requires_amx
@pytest.mark.parametrize("rows", [16, 33, 2049])
def test_the_amx_kernel_itself_gives_the_exact_sums_scaled(amx_gemm, rows):
    """Called directly (the dispatch cannot hide a fall back to VNNI)."""
    library = _library()
    generator = torch.Generator().manual_seed(rows)
    w = torch.randint(-127, 128, (200, 1536), dtype=torch.int8, generator=generator)
    q = torch.randint(-127, 128, (rows, 1536), dtype=torch.int8, generator=generator)
    scales = torch.rand(rows, generator=generator)
    col_scales = torch.rand(200, generator=generator) * 1e-3
    packed = amx_gemm.pack(w)
    out = torch.zeros(rows, 200, dtype=torch.bfloat16)
    status = library.int8_amx_gemm_bf16(
        q.data_ptr(), scales.data_ptr(), rows, 1536, packed.packed.data_ptr(),
        col_scales.data_ptr(), None, 200, out.data_ptr(), 0,
    )  # fmt: skip
    want = ((q.double() @ w.double().T).float() * scales[:, None] * col_scales).to(torch.bfloat16)
    assert status == 0 and torch.equal(out, want)
    assert torch.equal(amx_gemm.gemm(q, scales, packed, col_scales, None), want)


# Runs in a fresh process (a read past the end is a SIGSEGV there, not a
# failed test here): each width's compensation placed so that it ends exactly
# where a PROT_NONE page begins, then the matmul at 1..7 rows: A8 against the
# exact integer product, A13 against the same call on unguarded weights.
_GUARDED = """
import ctypes, dataclasses, mmap, sys, torch
from sluice.models.native.int8 import int8_gemm_kernels
gemm = int8_gemm_kernels()
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
for n in map(int, sys.argv[1:]):
    page, k = mmap.PAGESIZE, 64
    data = -(-4 * n // page) * page
    region = mmap.mmap(-1, data + page)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert libc.mprotect(start + data, page, 0) == 0, ctypes.get_errno()  # PROT_NONE
    generator = torch.Generator().manual_seed(n)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=generator)
    q = torch.randint(-127, 128, (7, k), dtype=torch.int8, generator=generator)
    x = torch.randn(7, k, generator=generator).to(torch.bfloat16)
    scales, col_scales = torch.rand(7, generator=generator), torch.rand(n, generator=generator)
    inv_smooth = torch.ones(k)
    packed = gemm.pack(w)
    guarded = torch.frombuffer(region, dtype=torch.int32, count=n, offset=data - 4 * n)
    guarded.copy_(packed.compensation)
    guarded = dataclasses.replace(packed, compensation=guarded)
    for rows in range(1, 8):
        exact = (q[:rows].double() @ w.double().T).float() * scales[:rows, None] * col_scales
        got = gemm.gemm(q[:rows], scales[:rows], guarded, col_scales, None)
        assert torch.equal(got, exact.to(torch.bfloat16)), (n, rows)
        got = gemm.linear(x[:rows], inv_smooth, guarded, col_scales, None, True)
        want = gemm.linear(x[:rows], inv_smooth, packed, col_scales, None, True)
        assert torch.equal(got, want), (n, rows)
    print("ok", n, flush=True)
"""


@requires_gemm
def test_the_matmul_reads_no_compensation_past_the_last_column():
    # Issue 40: exact_sums loaded whole 64-column tiles of the compensation,
    # up to 252 bytes past its end for widths off a tile (32,001 and 32,016
    # are real vocabularies, read on lm_head every step).
    import subprocess
    import sys

    widths = ["65", "127", "32001", "32016", "1", "64"]
    command = [sys.executable, "-c", _GUARDED, *widths]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    assert done.stdout.split() == [word for n in widths for word in ("ok", n)]
