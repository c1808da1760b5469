"""Every exported native kernel, called through its wrapper at awkward sizes
(widths off every tile and vector, single rows and columns, odd lengths):
run as a script by tests/test_native_sanitized.py, in a process whose
library was built with AddressSanitizer, so a read or write past any
buffer aborts the process with ASan's report.

Prints one JSON line: the library it loaded, the table's functions this
process called, and which `*_available` gates said no (their kernels cannot
run on this CPU).
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np
import torch

from sluice.models import kv_int8, native
from sluice.models.block_codes import FORMATS, BlockCodes
from sluice.models.native import abi
from sluice.models.native.int8 import int8_gemm_kernels, int8_row_kernels
from sluice.models.native.mxfp4 import mxfp4_available, mxfp4_groups, mxfp4_matmul, mxfp4_moe
from sluice.models.native.prefill import prefill_attention_amx_kernel, prefill_attention_kernel
from sluice.models.native.qblock import (
    QBlockMatrix,
    expert_array,
    part_array,
    qblock_available,
    qblock_matmul,
    qblock_matmul_parts,
    qblock_moe,
    qblock_rows,
)
from sluice.models.native.recurrent import Kept, RecurrentRows, gated_delta_rule, mamba_scan
from sluice.models.native.rope import rope_write_kv_kernel
from sluice.models.qblock_pack import super_block_bytes

BF16, F32 = torch.bfloat16, torch.float32
generator = torch.Generator().manual_seed(0)
rng = np.random.default_rng(0)


def randn(*shape: int, dtype=F32) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(dtype)


class Counted:
    """A library function that records its calls (a test-owned proxy)."""

    def __init__(self, function, name: str, called: set[str]) -> None:
        self._function, self._name, self._called = function, name, called

    def __call__(self, *args):
        self._called.add(self._name)
        return self._function(*args)


def cache_and_tables(lengths: list[int], kv_heads: int, head_dim: int, dtype, block_size=16):
    """A random paged cache and each sequence's block table (scattered blocks)."""
    per_seq = max(-(-n // block_size) for n in lengths)
    num_blocks = per_seq * len(lengths) + 3
    cache = randn(2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    order = torch.randperm(num_blocks, generator=generator)
    block_ids = order[: per_seq * len(lengths)].view(len(lengths), per_seq).contiguous()
    return cache, block_ids, torch.tensor(lengths, dtype=torch.int64)


def decode_attention() -> None:
    kernels = [(native.decode_attention_kernel(dtype), dtype) for dtype in (BF16, F32)]
    kernels.append((native.decode_attention_amx_kernel(BF16), BF16))
    for kernel, dtype in kernels:
        if kernel is None:
            continue
        for (heads, kv_heads), head_dim in (
            ((9, 3), 64),
            ((8, 1), 128),
            ((3, 3), 96),
            ((2, 1), 32),
        ):
            for lengths in ([1], [17], [5, 33, 16, 1], [1, 2, 3, 4, 5, 6, 7, 200]):
                cache, block_ids, seq_lens = cache_and_tables(lengths, kv_heads, head_dim, dtype)
                q = randn(len(lengths), heads, head_dim, dtype=dtype)
                kernel(q, cache, block_ids, seq_lens, 0.125)


def decode_attention_int8kv() -> None:
    """paged_decode_attention.c over an int8 pool (models/kv_int8.py): the
    fixed-block heads (64, 128) and one it refuses (96: the caller dequantizes)."""
    kernel = native.decode_attention_int8kv_kernel()
    assert kernel is not None, "the library is loaded"
    for (heads, kv_heads), head_dim in (((9, 3), 64), ((8, 1), 128), ((3, 3), 96)):
        for lengths in ([1], [17], [5, 33, 16, 1], [1, 2, 3, 4, 5, 6, 7, 200]):
            cache, block_ids, seq_lens = cache_and_tables(lengths, kv_heads, head_dim, F32)
            q = randn(len(lengths), heads, head_dim, dtype=BF16)
            kernel(q, kv_int8.quantize_rows(cache), block_ids, seq_lens, 0.125)


def prefill_attention() -> None:
    for kernel in (prefill_attention_kernel(BF16), prefill_attention_amx_kernel(BF16)):
        if kernel is None:
            continue
        for (heads, kv_heads), head_dim in (((9, 3), 64), ((4, 1), 128)):
            for queries, keys in ((1, 1), (1, 17), (17, 17), (33, 70), (5, 100)):
                q = randn(queries, heads, head_dim, dtype=BF16)
                k = randn(keys, kv_heads, head_dim, dtype=BF16)
                v = randn(keys, kv_heads, head_dim, dtype=BF16)
                kernel(q, k, v, 0.125)


def rows() -> None:
    for dtype in (BF16, F32):
        rms_norm, silu_mul = native.rms_norm_kernel(dtype), native.silu_mul_kernel(dtype)
        clamped_swiglu = native.clamped_swiglu_kernel(dtype)
        for count in (1, 5):
            for width in (1, 33, 577):
                rms_norm(randn(count, width, dtype=dtype), randn(width, dtype=dtype), 1e-6)
                silu_mul(randn(count, 2 * width, dtype=dtype))
                clamped_swiglu(randn(count, 2 * width, dtype=dtype), 1.702, 7.0)
    argmax = native.argmax_kernel()
    for count, width in ((1, 1), (5, 17), (3, 49153)):
        argmax(randn(count, width))
    merge = native.merge_attention_kernel()
    for tokens, heads, dim in ((1, 1, 1), (3, 2, 65), (5, 9, 64)):
        x, y = randn(tokens, heads, dim, dtype=BF16), randn(tokens, heads, dim, dtype=BF16)
        out = torch.empty(tokens, heads, dim, dtype=BF16)
        merge(x, randn(tokens, heads), y, randn(tokens, heads), out)


def rope() -> None:
    kernel = rope_write_kv_kernel(BF16)
    for tokens, heads, kv_heads, head_dim in ((1, 1, 1, 2), (17, 9, 3, 64), (5, 4, 2, 128)):
        qkv = randn(tokens, heads + 2 * kv_heads, head_dim, dtype=BF16)
        cos, sin = randn(tokens, head_dim // 2), randn(tokens, head_dim // 2)
        cache = torch.zeros(2, 3, 16, kv_heads, head_dim, dtype=BF16)
        slots = torch.randperm(3 * 16, generator=generator)[:tokens]
        kernel(qkv, heads, cos, sin, cache, slots)


def int8_rows() -> None:
    for dtype in (BF16, F32):
        quantize, dequantize = int8_row_kernels(dtype)
        for count, width in ((1, 1), (5, 17), (3, 2048)):
            q, scales = quantize(randn(count, width, dtype=dtype), torch.rand(width) + 0.5)
            if dtype == BF16:  # A13's pass, which only int8_linear_bf16 calls in C
                x = randn(count, width, dtype=dtype)
                codes, scales = torch.empty(2 * count, width, dtype=torch.int8), torch.empty(count)
                inv_smooth = torch.rand(width) + 0.5
                native._library().quantize_row_pairs_bf16(
                    x.data_ptr(), count, width, width, inv_smooth.data_ptr(),
                    codes.data_ptr(), scales.data_ptr(),
                )  # fmt: skip
            acc = torch.randint(-1000, 1000, (count, width), dtype=torch.int32)
            for bias in (None, randn(width, dtype=dtype)):
                dequantize(acc, scales, torch.rand(width), bias)


def int8_gemm() -> None:
    gemm = int8_gemm_kernels()
    if gemm is None:
        return
    for n, k in ((1, 4), (65, 68), (127, 64), (32001, 64), (200, 1536)):
        packed = gemm.pack(torch.randint(-127, 128, (n, k), dtype=torch.int8))
        col_scales = torch.rand(n)
        for count in (1, 7, 13):
            x, inv_smooth = randn(count, k, dtype=BF16), torch.rand(k) + 0.5
            q = torch.randint(-127, 128, (count, k), dtype=torch.int8)
            for bias in (None, randn(n, dtype=BF16)):
                gemm.gemm(q, torch.rand(count), packed, col_scales, bias)
                for pairs in (False, True):
                    gemm.linear(x, inv_smooth, packed, col_scales, bias, pairs)
                    gemm.linear(x, inv_smooth, packed, col_scales, bias, pairs, amx_min_rows=1)
            if gemm.has_amx and k % 64 == 0:  # called directly: the dispatch may keep VNNI
                out, row_scales = torch.empty(count, n, dtype=BF16), torch.rand(count)
                status = native._library().int8_amx_gemm_bf16(
                    q.data_ptr(), row_scales.data_ptr(), count, k, packed.packed.data_ptr(),
                    col_scales.data_ptr(), None, n, out.data_ptr(), 0,
                )  # fmt: skip
                assert status == 0, status


def matrix(gemm, out_features: int, in_features: int) -> tuple[abi.LayerMatrix, list]:
    """A W8A8 LayerMatrix of random weights, and the tensors it points at (kept alive)."""
    packed = gemm.pack(torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8))
    col_scales, inv_smooth = torch.rand(out_features) * 1e-2, torch.rand(in_features) + 0.5
    struct = abi.Int8Matrix(
        packed.packed.data_ptr(), packed.compensation.data_ptr(), col_scales.data_ptr(),
        inv_smooth.data_ptr(), None, out_features, in_features, 1,
    )  # fmt: skip
    return abi.LayerMatrix(struct, 0, None), [packed, col_scales, inv_smooth]


def block_matrix(formats: list[tuple[str, int]], in_features: int) -> tuple[abi.LayerMatrix, list]:
    """A LayerMatrix of GGUF-block parts ((format, rows) each, side by side)."""
    parts = (abi.QBlockPart * len(formats))()
    keep = [parts]
    for struct, (name, rows) in zip(parts, formats, strict=True):
        fmt = FORMATS[name]
        packed = QBlockMatrix.from_codes(random_codes(fmt, rows, in_features)).packed
        keep.append(packed)
        struct.packed, struct.out_features = packed.data_ptr(), rows
        struct.bits, struct.sub, struct.super_block = fmt.bits, fmt.sub_block, fmt.super_block
        struct.has_scales, struct.has_min, struct.offset = fmt.has_scales, fmt.has_min, fmt.offset
    total = sum(rows for _, rows in formats)
    shape = abi.Int8Matrix(out_features=total, in_features=in_features)
    return abi.LayerMatrix(shape, len(formats), parts), keep


def decoder_layer() -> None:
    """decode_layer.c with a hand-built DecoderLayer: hidden 68, 3 heads of 32
    over 1 KV head, intermediate 100, three decode rows of odd lengths."""
    gemm = int8_gemm_kernels()
    if gemm is None:
        return
    hidden, heads, kv_heads, head_dim, inter = 68, 3, 1, 32, 100
    qkv, keep_qkv = matrix(gemm, (heads + 2 * kv_heads) * head_dim, hidden)
    o, keep_o = matrix(gemm, hidden, heads * head_dim)
    gate_up, keep_gate_up = matrix(gemm, 2 * inter, hidden)
    down, keep_down = matrix(gemm, hidden, inter)
    run_decoder_layer((qkv, o, gate_up, down), hidden, heads, kv_heads, head_dim, inter)
    del keep_qkv, keep_o, keep_gate_up, keep_down


def decoder_layer_blocks() -> None:
    """decode_layer.c over GGUF-block matrices (qblock_gemm.c): hidden 64, 2
    heads of 32 over 1 KV head, intermediate 96, qkv and gate_up in two formats
    each, widths off the 16-column tiles."""
    if not qblock_available():
        return
    hidden, heads, kv_heads, head_dim, inter = 64, 2, 1, 32, 96
    qkv, keep_qkv = block_matrix([("Q4_1", 96), ("Q8_0", 32)], hidden)
    o, keep_o = block_matrix([("Q5_0", hidden)], heads * head_dim)
    gate_up, keep_gate_up = block_matrix([("Q4_0", 90), ("Q5_1", 102)], hidden)
    down, keep_down = block_matrix([("Q4_1", hidden)], inter)
    run_decoder_layer((qkv, o, gate_up, down), hidden, heads, kv_heads, head_dim, inter)
    del keep_qkv, keep_o, keep_gate_up, keep_down


def run_decoder_layer(matrices, hidden, heads, kv_heads, head_dim, inter) -> None:
    qkv, o, gate_up, down = matrices
    norms = randn(hidden, dtype=BF16), randn(hidden, dtype=BF16)
    for amx in (0, 1) if native.decode_attention_amx_kernel(BF16) else (0,):
        layer = abi.DecoderLayer(
            norms[0].data_ptr(), norms[1].data_ptr(), qkv, o, gate_up, down,
            hidden, heads, kv_heads, head_dim, inter, 1e-6, head_dim**-0.5, amx,
        )  # fmt: skip
        lengths = [1, 17, 5]
        cache, block_ids, seq_lens = cache_and_tables(lengths, kv_heads, head_dim, BF16)
        slots = torch.stack([block_ids[i, (n - 1) // 16] * 16 + (n - 1) % 16
                             for i, n in enumerate(lengths)])  # fmt: skip
        states = randn(len(lengths), hidden, dtype=BF16)
        cos, sin = randn(len(lengths), head_dim // 2), randn(len(lengths), head_dim // 2)
        amx_min_rows = (ctypes.c_int64 * 4)()
        status = native._library().decoder_layer_rows_bf16(
            ctypes.byref(layer), states.data_ptr(), len(lengths), cos.data_ptr(), sin.data_ptr(),
            cache.data_ptr(), cache.shape[1], 16, slots.data_ptr(), block_ids.data_ptr(),
            block_ids.shape[1], seq_lens.data_ptr(), amx_min_rows,
        )  # fmt: skip
        assert status == 0 and states.isfinite().all(), status


def random_codes(fmt, n: int, k: int) -> BlockCodes:
    subs, supers = k // fmt.sub_block, k // fmt.super_block
    return BlockCodes(
        fmt,
        rng.integers(0, 2**fmt.bits, (n, k), dtype=np.uint8),
        rng.integers(0, 64, (n, subs), dtype=np.int8) if fmt.has_scales else None,
        rng.integers(0, 64, (n, subs), dtype=np.int8) if fmt.has_scales and fmt.has_min else None,
        rng.random((n, supers)).astype(np.float16),
        rng.random((n, supers)).astype(np.float16) if fmt.has_min else None,
    )


def qblock() -> None:
    """qblock_gemm.c: every block format, widths off its 16-column tiles,
    outputs written into a column slice of a wider tensor."""
    if not qblock_available():
        return
    library = native._library()
    for fmt in FORMATS.values():
        size = library.qblock_super_bytes(fmt.bits, fmt.sub_block, fmt.super_block,
                                          int(fmt.has_scales), int(fmt.has_min))  # fmt: skip
        assert size == super_block_bytes(fmt), fmt.name
        for n, supers in ((1, 1), (17, 2), (33, 1)):
            k = supers * fmt.super_block
            matrix = QBlockMatrix.from_codes(random_codes(fmt, n, k))
            for dtype in (BF16, F32):
                for count in (1, 5):
                    qblock_matmul(randn(count, k, dtype=dtype), matrix)
                wide = torch.empty(3, n + 7, dtype=dtype)
                qblock_matmul(randn(3, k, dtype=dtype), matrix, wide[:, 2 : 2 + n])
            qblock_rows(matrix, torch.tensor([n - 1, 0]))
    # Parts of two formats in one call (one quantization each), 1 and 6 rows.
    parts = [QBlockMatrix.from_codes(random_codes(FORMATS[name], n, 512))
             for name, n in (("Q4_K", 33), ("Q6_K", 16), ("Q8_0", 7))]  # fmt: skip
    for count in (1, 6):
        out = torch.empty(count, 56, dtype=BF16)
        qblock_matmul_parts(randn(count, 512, dtype=BF16), part_array(parts), out)


def moe_qblock() -> None:
    """moe_qblock.c: 5 experts (gate/up in two parts of two formats, widths
    off the tiles; down Q8_0), 1, 3 and 70 tokens (an expert with over one
    64-row chunk) of top 1 and top 3, both dtypes."""
    if not qblock_available():
        return
    hidden, inter, keep, matrices = 256, 64, [], []
    for _ in range(5):
        gate = QBlockMatrix.from_codes(random_codes(FORMATS["Q4_K"], inter - 24, hidden))
        up = QBlockMatrix.from_codes(random_codes(FORMATS["Q8_0"], inter + 24, hidden))
        down = QBlockMatrix.from_codes(random_codes(FORMATS["Q8_0"], hidden, inter))
        matrices.extend([gate, up, down])  # the part arrays point into their bytes
        keep.append((part_array([gate, up]), part_array([down])))
    experts = expert_array(keep)
    for dtype in (BF16, F32):
        for tokens, top_k in ((1, 1), (3, 3), (70, 3)):
            ids = torch.stack(
                [torch.randperm(5, generator=generator)[:top_k] for _ in range(tokens)]
            )
            weights = torch.rand(tokens, top_k, generator=generator)
            out = qblock_moe(randn(tokens, hidden, dtype=dtype), experts, inter, ids, weights)
            assert out.isfinite().all()


def mxfp4() -> None:
    """mxfp4_gemm.c: widths of one and of several 32-value groups, odd row
    counts, an all-zero group, outputs written into a column slice."""
    if not mxfp4_available():
        return
    g = torch.Generator().manual_seed(3)
    for n, k in ((1, 32), (17, 96), (33, 256)):
        blocks = torch.randint(0, 256, (n, k // 32, 16), dtype=torch.uint8, generator=g)
        scales = torch.randint(118, 132, (n, k // 32), dtype=torch.uint8, generator=g)
        groups = mxfp4_groups(blocks, scales)
        for dtype in (BF16, F32):
            for count in (1, 5):
                x = randn(count, k, dtype=dtype)
                x[0, :32] = 0
                mxfp4_matmul(x, groups)
            wide = torch.empty(3, n + 7, dtype=dtype)
            mxfp4_matmul(randn(3, k, dtype=dtype), groups, wide[:, 2 : 2 + n])
    mxfp4_moe_layer(g)


def mxfp4_moe_layer(g: torch.Generator) -> None:
    """moe_mxfp4.c: 3 experts, hidden 64, width 32, 1 and 7 tokens of top 2, both dtypes."""
    experts, hidden, width = 3, 64, 32

    def stack(rows: int, k: int) -> torch.Tensor:
        blocks = torch.randint(
            0, 256, (experts * rows, k // 32, 16), dtype=torch.uint8, generator=g
        )
        scales = torch.randint(118, 132, (experts * rows, k // 32), dtype=torch.uint8, generator=g)
        return mxfp4_groups(blocks, scales).reshape(experts, rows, k // 32, -1).contiguous()

    stacks = (stack(2 * width, hidden), stack(hidden, width))
    for dtype in (BF16, F32):
        biases = (randn(experts, 2 * width, dtype=dtype), randn(experts, hidden, dtype=dtype))
        for tokens in (1, 7):
            ids = torch.stack([torch.randperm(experts, generator=g)[:2] for _ in range(tokens)])
            weights = torch.rand(tokens, 2, generator=g)
            out = mxfp4_moe(
                randn(tokens, hidden, dtype=dtype), stacks, biases, ids, weights, 1.702, 7.0
            )
            assert out.isfinite().all()


def recurrences() -> None:
    """gated_delta.c and mamba_scan.c: widths off every vector (dk, dv, N of
    5..33), grouped heads, sequences of 0, 1 and 6 tokens (one from zeros,
    one from a cache row), state rows after a conv tail (strided), saves to
    snapshot rows and to kept rows, both roundings."""
    spans = [(0, 1, None), (1, 0, 2), (1, 6, 3)]
    saves = [(0, 1, 0), (1, 0, 1), (2, 6, 4), (2, 3, 5)] + [(2, m, Kept(m)) for m in range(7)]
    rows = RecurrentRows(spans, saves)
    for hk, hv, dk, dv in ((1, 3, 5, 7), (2, 2, 33, 17)):
        numel = hv * dk * dv
        cache, kept = randn(6, numel + 3), randn(7, numel)
        inputs = [randn(7, 2 * hk * dk + hv * dv), randn(7, hv * dv), randn(7, hv), randn(7, hv)]
        weights = (-randn(hv).exp(), randn(hv), randn(dv))
        for bf16 in (False, True):
            out = gated_delta_rule(tuple(inputs), weights, rows, cache[:, 3:], kept, (hk, hv, dk, dv),
                                   1e-6, bf16)  # fmt: skip
            assert out.isfinite().all()
    for heads, dim, groups, n in ((3, 5, 1, 7), (4, 3, 2, 33)):
        numel = heads * dim * n
        cache, kept = randn(6, numel + 5), randn(7, numel)
        dt = torch.rand(7, heads, generator=generator)
        y = mamba_scan(randn(7, heads, dim), dt, (-dt).exp(), randn(7, groups, n),
                       randn(7, groups, n), rows, cache[:, 5:], kept)  # fmt: skip
        assert y.isfinite().all()


def main() -> None:
    library = native._library()
    assert library is not None, native.native_status().describe()
    called: set[str] = set()
    for name in abi.FUNCTIONS:
        setattr(library, name, Counted(getattr(library, name), name, called))
    drives = (decode_attention, decode_attention_int8kv, prefill_attention, rows, rope, int8_rows,
              int8_gemm,
              decoder_layer, decoder_layer_blocks, qblock, moe_qblock, mxfp4,
              recurrences)  # fmt: skip
    for drive in drives:
        drive()
        print(f"{drive.__name__}: done", file=sys.stderr, flush=True)
    gated_off = [name for name in abi.FUNCTIONS if name.endswith("_available")
                 and not getattr(library, name)()]  # fmt: skip
    print(json.dumps({"library": library._name, "called": sorted(called), "gated_off": gated_off}))


if __name__ == "__main__":
    main()
