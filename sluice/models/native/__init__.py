"""Small C kernels for the CPU hot path, built with the system C compiler on first use.

`paged_decode_attention.c` reads K/V straight from the paged cache (no
gathered copy) for decode steps; `prefill_attention.c` is flash attention
for prefill chunks, `prefill_attention_amx.c` the same on AMX-BF16 tiles
(their wrappers are in `prefill.py`); each pair runs every query row
through one per-row step over key blocks at fixed positions
(`avx512_attention.c`, `amx_attention.h`), so a row's bits do not depend on
its chunk or on whether a decode step computed it; `rope_kv.c` rotates a
step's queries and keys and writes keys and values into the cache in one
pass (`rope.py`); `rms_norm.c` normalises rows in one pass;
`int8_rows.c` and `int8_gemm.c` are W8A8's passes and matmul, with
`int8_amx.c` the same matmul on AMX-INT8 tiles for large steps (their
wrappers are in `int8.py`); `rows.c` computes
SwiGLU's silu(gate) * up in one pass (64 rows of the embedded model: 0.04
ms, against 0.07 ms for torch's two ops on the strided gate half) and the
rows' argmax of greedy sampling (64 rows of 49,152 logits: 1.2 ms, against
1.8-2.6 ms for torch's argmax). They are compiled once per CPU, compiler and source
into the cache directory (`native_dir`; build.py), loaded with ctypes, and called with
tensors' data pointers: no torch headers, so a build takes about a second.
Every exported function and struct is declared once, in sluice_abi.h, which
every .c file includes; abi.py is its one Python table, from which every
ctypes binding is set at load (tests/test_native_abi.py holds the two equal).
It is built with OpenMP and loaded after torch, so it shares torch's OpenMP
runtime (and thread count) rather than starting a second pool.

Invariant: these kernels are an optimisation only. When no compiler is there,
the build fails, or `SLUICE_NATIVE_KERNELS=0` is set, each `*_kernel` function
returns None and the caller keeps its pure-torch path, which computes the same
values (tests compare the two). `native_status()` says which, and why: the
startup line shows it, and a failed build logs the compiler's errors. Where a
compiler exists, the tests require the library to build.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
from functools import cache

import torch
from torch import Tensor

from sluice.models.native import abi
from sluice.models.native.build import (
    NativeStatus,
    build_library,
    find_compiler,
    library_path,
    native_dir,
)

__all__ = ["NativeStatus", "find_compiler", "native_dir", "native_status"]

logger = logging.getLogger(__name__)

# The compiler's stderr logged when a build fails: its last errors.
_STDERR_TAIL_CHARS = 2000


def native_status() -> NativeStatus:
    """Whether the kernels are on in this process (building them if not yet)."""
    return _loaded()[1]


def _library() -> ctypes.CDLL | None:
    return _loaded()[0]


@cache
def _loaded() -> tuple[ctypes.CDLL | None, NativeStatus]:
    if os.environ.get("SLUICE_NATIVE_KERNELS", "1") == "0":
        return None, NativeStatus(False, "SLUICE_NATIVE_KERNELS=0")
    compiler = find_compiler()
    if compiler is None:
        return None, NativeStatus(False, f"no C compiler ({os.environ.get('CC', 'cc')})")
    target = library_path(compiler)
    try:
        if not target.exists():
            build_library(compiler, target)
        library = ctypes.CDLL(str(target))
    except subprocess.CalledProcessError as error:
        tail = error.stderr.decode(errors="replace").strip()[-_STDERR_TAIL_CHARS:]
        logger.warning("native kernels not built, using the torch path: %s\n%s", error, tail)
        return None, NativeStatus(False, f"build failed: {_first_error(tail) or error}")
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("native kernels unavailable, using the torch path: %s", error)
        return None, NativeStatus(False, f"build failed: {error}")
    abi.declare(library)
    return library, NativeStatus(True)


def _first_error(stderr: str) -> str:
    """The compiler's first error line (its last lines only count them)."""
    lines = stderr.splitlines()
    return next((line for line in lines if "error" in line), lines[-1] if lines else "")


@cache
def decode_attention_kernel(dtype: torch.dtype):
    """The kernel for `dtype` CPU tensors, or None (then use the torch path)."""
    if dtype not in (torch.bfloat16, torch.float32):
        return None
    library = _library()
    if library is None:
        return None
    function = (
        library.decode_attention_bf16 if dtype == torch.bfloat16 else library.decode_attention_f32
    )
    return _DecodeAttention(function)


@cache
def decode_attention_amx_kernel(dtype: torch.dtype):
    """decode_attention_kernel's call on AMX-BF16 tiles (decode_attention_amx.c):
    a decode row gets the bits its query gets in a prefill chunk on
    prefill_attention_amx.c; None for other dtypes, or where the CPU or the
    OS grants no AMX tiles."""
    library = _library()
    if dtype != torch.bfloat16 or library is None or not library.decode_attention_amx_available():
        return None
    return _DecodeAttention(library.decode_attention_amx_bf16)


class _DecodeAttention:
    __slots__ = ("_function",)

    def __init__(self, function):
        self._function = function

    def __call__(
        self,
        q: Tensor,  # [num_seqs, num_heads, head_dim]; heads and dims contiguous
        kv_cache: Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim], contiguous
        block_ids: Tensor,  # [num_seqs, blocks_per_seq] int64
        seq_lens: Tensor,  # [num_seqs] int64
        scale: float,
    ) -> Tensor:  # [num_seqs, num_heads, head_dim]
        status, out = self.run(q, kv_cache, block_ids, seq_lens, scale)
        if status != 0:
            raise ValueError(
                "decode attention: a sequence length or block id is out of range, "
                "or the head layout is unsupported"
            )
        return out

    def run(
        self, q: Tensor, kv_cache: Tensor, block_ids: Tensor, seq_lens: Tensor, scale: float
    ) -> tuple[int, Tensor]:
        """The kernel's status and its output (written where the status is 0)."""
        num_seqs, num_heads, head_dim = q.shape
        _, num_blocks, block_size, num_kv_heads, _ = kv_cache.shape
        assert q.stride(2) == 1 and q.stride(1) == head_dim, "heads and dims contiguous"
        assert kv_cache.is_contiguous(), "the cache is read through raw offsets"
        block_ids, seq_lens = block_ids.contiguous(), seq_lens.contiguous()
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype)
        status = self._function(
            q.data_ptr(),
            kv_cache.data_ptr(),
            block_ids.data_ptr(),
            seq_lens.data_ptr(),
            q.stride(0),
            num_seqs,
            block_ids.shape[1],
            num_blocks,
            block_size,
            num_heads,
            num_kv_heads,
            head_dim,
            scale,
            out.data_ptr(),
        )
        return status, out


@cache
def decode_attention_int8kv_kernel():
    """decode_attention_int8kv(q [S, Hq, D] bf16, int8 pool [2, blocks, block_size,
    Hkv, D * 5 / 4] (models/kv_int8.py), block_ids, seq_lens, scale) -> [S, Hq, D] or
    None where the kernel does not take these heads (the caller dequantizes);
    a row gets the bits the bf16 decode kernel gives it over the dequantized
    pool. None: no native library."""
    library = _library()
    if library is None:
        return None
    attention = _DecodeAttention(library.decode_attention_int8kv_bf16)

    def decode_attention_int8kv(
        q: Tensor, kv_cache: Tensor, block_ids: Tensor, seq_lens: Tensor, scale: float
    ) -> Tensor | None:
        status, out = attention.run(q, kv_cache, block_ids, seq_lens, scale)
        if status < 0:
            raise ValueError(
                "decode attention (int8 KV): a sequence length or block id is out of range"
            )
        return out if status == 0 else None

    return decode_attention_int8kv


@cache
def rms_norm_kernel(dtype: torch.dtype):
    """x [T, hidden] (rows contiguous), w [hidden] -> rms_norm(x) * w; None: no kernel."""
    if dtype not in (torch.bfloat16, torch.float32):
        return None
    library = _library()
    if library is None:
        return None
    function = library.rms_norm_bf16 if dtype == torch.bfloat16 else library.rms_norm_f32

    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        rows, hidden = x.shape
        assert x.stride(1) == 1 and weight.is_contiguous(), "rows and weight contiguous"
        out = torch.empty((rows, hidden), dtype=x.dtype)
        function(x.data_ptr(), weight.data_ptr(), rows, hidden, x.stride(0), eps, out.data_ptr())
        return out

    return rms_norm


def _row_function(dtype: torch.dtype, name: str):
    """The library's `name`_bf16 or `name`_f32 for `dtype` rows; None: no kernel."""
    if dtype not in (torch.bfloat16, torch.float32):
        return None
    library = _library()
    if library is None:
        return None
    return getattr(library, name + ("_bf16" if dtype == torch.bfloat16 else "_f32"))


@cache
def silu_mul_kernel(dtype: torch.dtype):
    """x [T, 2 I] (gate, then up; rows contiguous) -> silu(gate) * up [T, I]; None: no kernel."""
    function = _row_function(dtype, "silu_mul")
    if function is None:
        return None

    def silu_mul(x: Tensor) -> Tensor:
        rows, width = x.shape
        assert x.stride(1) == 1 and width % 2 == 0, "rows contiguous, gate and up halves"
        out = torch.empty((rows, width // 2), dtype=x.dtype)
        function(x.data_ptr(), rows, width // 2, x.stride(0), out.data_ptr())
        return out

    return silu_mul


@cache
def clamped_swiglu_kernel(dtype: torch.dtype):
    """x [T, 2 I] (gate, then up; rows contiguous), alpha, limit -> gpt-oss's
    clamped SwiGLU [T, I] (rows.c); None: no kernel."""
    function = _row_function(dtype, "clamped_swiglu")
    if function is None:
        return None

    def clamped_swiglu(x: Tensor, alpha: float, limit: float) -> Tensor:
        rows, width = x.shape
        assert x.stride(1) == 1 and width % 2 == 0, "rows contiguous, gate and up halves"
        out = torch.empty((rows, width // 2), dtype=x.dtype)
        function(x.data_ptr(), rows, width // 2, x.stride(0), alpha, limit, out.data_ptr())
        return out

    return clamped_swiglu


@cache
def argmax_kernel():
    """x [B, V] float32 (rows contiguous) -> [B] int64, torch.argmax's answer; None: no kernel."""
    library = _library()
    if library is None:
        return None
    function = library.argmax_f32

    def argmax(x: Tensor) -> Tensor:
        assert x.dtype == torch.float32, "float32 logits"
        x = x.contiguous()
        out = torch.empty(x.shape[0], dtype=torch.int64)
        function(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
        return out

    return argmax


@cache
def merge_attention_kernel():
    """Two bfloat16 attention results [T, H, D] over disjoint keys, with their
    float32 log-sum-exps [T, H], merged into one over both keys (rows.c),
    written into `out` [T, H, D]; None: no kernel. Every tensor's memory
    must be that layout, contiguous (the flash kernel's outputs are, as
    transposed views: the caller passes them as it gets them)."""
    library = _library()
    if library is None:
        return None
    function = library.merge_attention_bf16

    def merge(x: Tensor, lx: Tensor, y: Tensor, ly: Tensor, out: Tensor) -> None:
        tokens, heads, dim = out.shape
        for values in (x, y, out):
            assert values.dtype == torch.bfloat16 and values.stride() == (heads * dim, dim, 1)
        for lse in (lx, ly):
            assert lse.dtype == torch.float32 and lse.stride() == (heads, 1)
        function(x.data_ptr(), lx.data_ptr(), y.data_ptr(), ly.data_ptr(), tokens, heads, dim,
                 out.data_ptr())  # fmt: skip

    return merge
