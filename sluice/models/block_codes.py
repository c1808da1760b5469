"""The integer codes of a GGUF block type, the values the 4-bit path keeps.

Every block type sluice keeps quantized encodes a weight as

    w = D[s] * SC[j] * (q - OFFSET) - M[s] * MN[j]

over super-blocks s of `super_block` values along the input dimension and
sub-blocks j of `sub_block` values inside them: q is an unsigned code of
`bits` bits, SC and MN small integer scales and mins (absent, meaning 1 and
0, in the legacy types), D and M float16. Decoding pulls those integers out
of llama.cpp's bit layout unchanged (loader/gguf_blocks.py), so the values are exactly the file's
(tests check them against gguf-py's dequantization), and the kernel in
`native/qblock_gemm.c` can keep llama.cpp's arithmetic: an exact integer sum
inside each super-block, one float step per super-block.

    type   bits sub super  SC        MN       OFFSET  D, M
    Q4_0    4   32   32    -         -         8      d, -
    Q4_1    4   32   32    -         1         0      d, -m
    Q5_0    5   32   32    -         -        16      d, -
    Q5_1    5   32   32    -         1         0      d, -m
    Q8_0    8   32   32    -         -       128      d, -      (q stored + 128)
    Q4_K    4   32  256    6-bit     6-bit     0      d, dmin
    Q5_K    5   32  256    6-bit     6-bit     0      d, dmin
    Q6_K    6   16  256    int8      -        32      d, -
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK_K = 256


@dataclass(frozen=True, slots=True)
class BlockFormat:
    """How one GGML block type maps onto the codes above."""

    name: str
    bits: int
    sub_block: int
    super_block: int
    # SC per sub-block stored (else 1); MN per sub-block stored (else 1 where has_min).
    has_scales: bool
    has_min: bool
    offset: int
    # Bytes of one GGUF block of `super_block` values.
    block_bytes: int


FORMATS = {
    "Q4_0": BlockFormat("Q4_0", 4, 32, 32, False, False, 8, 18),
    "Q4_1": BlockFormat("Q4_1", 4, 32, 32, False, True, 0, 20),
    "Q5_0": BlockFormat("Q5_0", 5, 32, 32, False, False, 16, 22),
    "Q5_1": BlockFormat("Q5_1", 5, 32, 32, False, True, 0, 24),
    "Q8_0": BlockFormat("Q8_0", 8, 32, 32, False, False, 128, 34),
    "Q4_K": BlockFormat("Q4_K", 4, 32, QK_K, True, True, 0, 144),
    "Q5_K": BlockFormat("Q5_K", 5, 32, QK_K, True, True, 0, 176),
    "Q6_K": BlockFormat("Q6_K", 6, 16, QK_K, True, False, 32, 210),
}


@dataclass(slots=True)
class BlockCodes:
    """One weight matrix [rows, cols] as the integers of its blocks."""

    format: BlockFormat
    q: np.ndarray  # [rows, cols] uint8, in [0, 2**bits)
    scales: np.ndarray | None  # [rows, cols // sub_block] int8 (SC), or None
    mins: np.ndarray | None  # [rows, cols // sub_block] int8 (MN), or None
    d: np.ndarray  # [rows, cols // super_block] float16
    m: np.ndarray | None  # [rows, cols // super_block] float16, or None

    def dequantize(self) -> np.ndarray:
        """The float32 values, computed as llama.cpp does (one rounding at the end)."""
        fmt = self.format
        rows, cols = self.q.shape
        n_sub = cols // fmt.sub_block
        per_super = fmt.super_block // fmt.sub_block
        d = np.repeat(self.d.astype(np.float64), per_super, axis=1)  # [rows, n_sub]
        sc = 1.0 if self.scales is None else self.scales.astype(np.float64)
        q = self.q.astype(np.float64).reshape(rows, n_sub, fmt.sub_block) - fmt.offset
        values = (d * sc)[..., None] * q
        if self.m is not None:  # exactly the formats with a min (has_min)
            m = np.repeat(self.m.astype(np.float64), per_super, axis=1)
            mn = 1.0 if self.mins is None else self.mins.astype(np.float64)
            values = values - (m * mn)[..., None]
        return values.reshape(rows, cols).astype(np.float32)
