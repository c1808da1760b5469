"""A GGUF tensor's quantized blocks, decoded into the integer codes they hold.

Each block type's bits (llama.cpp's layouts: ggml-common.h) are unpacked
into `BlockCodes` (models/block_codes.py, which holds the table of types and
the formula), unchanged: the values are exactly the file's (tests check them
against gguf-py's dequantization).
"""

from __future__ import annotations

import numpy as np

from sluice.models.block_codes import FORMATS, QK_K, BlockCodes, BlockFormat

__all__ = ["FORMATS", "BlockCodes", "BlockFormat", "decode_blocks"]


def decode_blocks(raw: np.ndarray, type_name: str, cols: int) -> BlockCodes:
    """`raw` (uint8, the tensor's bytes, rows after rows) -> its codes.

    `cols` is the row length in values (GGUF's ne[0]); it must be whole blocks.
    """
    fmt = FORMATS[type_name]
    if cols % fmt.super_block:
        raise ValueError(f"{type_name} rows of {cols} values are not whole blocks")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, fmt.block_bytes)
    rows = blocks.shape[0] * fmt.super_block // cols
    decoded = _DECODERS[type_name](blocks)
    return _as_rows(fmt, rows, cols, *decoded)


def _as_rows(fmt, rows, cols, q, scales, mins, d, m) -> BlockCodes:
    def shaped(a, per_row):
        return None if a is None else np.ascontiguousarray(a.reshape(rows, per_row))

    n_sub, n_super = cols // fmt.sub_block, cols // fmt.super_block
    return BlockCodes(
        fmt,
        shaped(q.astype(np.uint8), cols),
        shaped(scales, n_sub),
        shaped(mins, n_sub),
        shaped(d, n_super),
        shaped(m, n_super),
    )


def _f16(column: np.ndarray) -> np.ndarray:  # [n, 2] uint8 -> [n] float16
    return np.ascontiguousarray(column).view(np.float16).reshape(-1)


def _nibbles(qs: np.ndarray) -> np.ndarray:  # [n, 16] -> [n, 32]: low nibbles first
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:  # [n, 4] uint8 -> [n, 32] bit i of the u32
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q4_0(b):
    return _nibbles(b[:, 2:18]), None, None, _f16(b[:, 0:2]), None


def _q4_1(b):
    return _nibbles(b[:, 4:20]), None, None, _f16(b[:, 0:2]), -_f16(b[:, 2:4])


def _q5_0(b):
    q = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)
    return q, None, None, _f16(b[:, 0:2]), None


def _q5_1(b):
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return q, None, None, _f16(b[:, 0:2]), -_f16(b[:, 2:4])


def _q8_0(b):
    q = (b[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return q, None, None, _f16(b[:, 0:2]), None


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's get_scale_min_k4: 12 bytes -> 8 six-bit scales and 8 mins."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(np.int8), mn.astype(np.int8)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:  # [n, 128] -> [n, 256]
    """Sub-block pairs share 32 bytes: the even sub-block in low nibbles."""
    pairs = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (pairs & 0x0F).reshape(-1, QK_K)


def _q4_k(b):
    sc, mn = _scale_min_k4(b[:, 4:16])
    return _k_nibbles(b[:, 16:144]), sc, mn, _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q5_k(b):
    sc, mn = _scale_min_k4(b[:, 4:16])
    # qh[l] bit s is the fifth bit of sub-block s's value l.
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = (b[:, 16:48].reshape(-1, 1, 32) >> shifts) & 1  # [n, 8, 32]
    q = _k_nibbles(b[:, 48:176]) | (high.reshape(-1, QK_K) << 4)
    return q, sc, mn, _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q6_k(b):
    ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    # Per half of 128 values: quarters at l, l+32, l+64, l+96 (l < 32).
    low = np.stack(
        [ql[:, :, :32] & 0xF, ql[:, :, 32:] & 0xF, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4]
    )
    high = np.stack([(qh >> shift) & 3 for shift in (0, 2, 4, 6)])  # [4, n, 2, 32]
    q = (low | (high << 4)).transpose(1, 2, 0, 3).reshape(-1, QK_K)
    return q, b[:, 192:208].view(np.int8), None, _f16(b[:, 208:210]), None


_DECODERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
