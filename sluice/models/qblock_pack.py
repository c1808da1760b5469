"""Block codes (models/block_codes.py) packed into the layout `native/qblock_gemm.c` reads.

Packing is done once at load, in numpy; the packed bytes are about the size
of the file's blocks (Q4_K 4.625 bits a weight against 4.5, Q6_K and the
legacy types exactly theirs), so a model stays 4-bit in memory.

Layout (the C file's header has it too): output columns in tiles of 16, the
last tile zero-padded; per tile, its super-blocks in order; per super-block
D[16] and M[16] float16, then per sub-block SC[16], MN[16] int8 and the
codes in groups that put 4 consecutive k of one column in one int32 lane.
"""

from __future__ import annotations

import numpy as np

from sluice.models.block_codes import BlockCodes, BlockFormat

TILE = 16


def super_block_bytes(fmt: BlockFormat) -> int:
    """Packed bytes of one tile's super-block (qblock_super_bytes in C)."""
    per_sub = TILE * fmt.sub_block * fmt.bits // 8
    per_sub += TILE if fmt.has_scales else 0
    per_sub += TILE if fmt.has_scales and fmt.has_min else 0
    head = 2 * TILE * (2 if fmt.has_min else 1)
    return head + (fmt.super_block // fmt.sub_block) * per_sub


def packed_bytes(fmt: BlockFormat, rows: int, cols: int) -> int:
    tiles = -(-rows // TILE)
    return tiles * (cols // fmt.super_block) * super_block_bytes(fmt)


def pack_codes(codes: BlockCodes) -> np.ndarray:
    """The packed uint8 buffer for `codes` (a [rows, cols] matrix, rows = outputs)."""
    fmt = codes.format
    rows, cols = codes.q.shape
    tiles = -(-rows // TILE)
    n_super, per_super = cols // fmt.super_block, fmt.super_block // fmt.sub_block

    def tiled(a: np.ndarray, per_row: int) -> np.ndarray:  # [rows, per_row] -> [T, per_row, 16]
        padded = np.zeros((tiles * TILE, per_row), dtype=a.dtype)
        padded[:rows] = a
        return padded.reshape(tiles, TILE, per_row).transpose(0, 2, 1)

    # Codes: [T, n_super, per_super, sub, 16] (k within the sub-block, then the column).
    q = tiled(codes.q, cols).reshape(tiles, n_super, per_super, fmt.sub_block, TILE)
    parts = [_f16_bytes(tiled(codes.d, n_super))]  # [T, n_super, 32]
    if fmt.has_min:
        parts.append(_f16_bytes(tiled(codes.m, n_super)))
    sub_parts = []
    if fmt.has_scales:
        sub_parts.append(_sub_bytes(tiled(codes.scales, cols // fmt.sub_block), n_super))
        if fmt.has_min:
            sub_parts.append(_sub_bytes(tiled(codes.mins, cols // fmt.sub_block), n_super))
    sub_parts.extend(_code_bytes(q, fmt.bits))
    per_sub = np.concatenate(sub_parts, axis=-1)  # [T, n_super, per_super, bytes]
    parts.append(per_sub.reshape(tiles, n_super, -1))
    packed = np.concatenate(parts, axis=-1)  # [T, n_super, super_block_bytes]
    assert packed.shape[-1] == super_block_bytes(fmt), "packed size disagrees with the layout"
    return np.ascontiguousarray(packed.reshape(-1))


def _f16_bytes(a: np.ndarray) -> np.ndarray:  # [T, n, 16] float16 -> [T, n, 32] uint8
    return np.ascontiguousarray(a.astype(np.float16)).view(np.uint8)


def _sub_bytes(a: np.ndarray, n_super: int) -> np.ndarray:  # [T, n_sub, 16] -> [T, S, J, 16]
    return a.astype(np.int8).view(np.uint8).reshape(a.shape[0], n_super, -1, TILE)


def _lanes(q: np.ndarray) -> np.ndarray:
    """[..., 4, 16] (k, column) -> [..., 64]: column c's 4 k in bytes 4c..4c+3."""
    return np.swapaxes(q, -1, -2).reshape(*q.shape[:-2], 64)


def _code_bytes(q: np.ndarray, bits: int) -> list[np.ndarray]:
    """q [T, S, J, sub, 16] -> the sub-block's code bytes [T, S, J, b] (low, then high)."""
    lead, sub = q.shape[:3], q.shape[3]
    if bits == 8:
        return [_lanes(q.reshape(*lead, sub // 4, 4, TILE)).reshape(*lead, -1)]
    groups = q.reshape(*lead, sub // 8, 2, 4, TILE)  # [.., g, half, i, c]
    low = _lanes(groups[..., 0, :, :] & 0xF) | (_lanes(groups[..., 1, :, :] & 0xF) << 4)
    out = [low.reshape(*lead, -1)]
    high = groups >> 4  # [.., g, half, i, c]
    if bits == 5:  # per 32 k: bit 2g + h
        per = high.reshape(*lead, sub // 32, 4, 2, 4, TILE)
        lanes = [_lanes(per[..., g, h, :, :]) << (2 * g + h) for g in range(4) for h in range(2)]
        out.append(np.bitwise_or.reduce(lanes).reshape(*lead, -1))
    elif bits == 6:  # per 16 k: bits 2(2g + h)
        per = high.reshape(*lead, sub // 16, 2, 2, 4, TILE)
        lanes = [
            _lanes(per[..., g, h, :, :]) << (2 * (2 * g + h)) for g in range(2) for h in range(2)
        ]
        out.append(np.bitwise_or.reduce(lanes).reshape(*lead, -1))
    return [part.astype(np.uint8) for part in out]
