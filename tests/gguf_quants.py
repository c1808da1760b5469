"""K-quant writers for tests: Q4_K, Q5_K and Q6_K blocks packed as llama.cpp lays them out.

The `gguf` package dequantizes every type but quantizes only the simple ones
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16). These writers fill the gap for
test GGUFs, written from llama.cpp's block structs (ggml-common.h) rather
than from gguf's dequantizers, so that a test comparing the two checks the
layout from both sides. They are plain, not llama.cpp's error-minimising
search: every value lands on the type's grid, which is all a test needs.

Each returns (blocks as uint8 [rows, bytes], the exact values they encode as
float32, computed from the unpacked integers and float16 scales).

    block_q4_K: f16 d, f16 dmin, u8 scales[12], u8 qs[128]            (144 bytes)
    block_q5_K: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128] (176 bytes)
    block_q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d           (210 bytes)
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def quantize_q4_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _quantize_min_k(x, bits=4)


def quantize_q5_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _quantize_min_k(x, bits=5)


def _quantize_min_k(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 8 sub-blocks of 32, value = d * sc * q - dmin * m (6-bit sc, m)."""
    blocks = _blocks(x).reshape(-1, 8, 32)  # [n, sub-block, 32]
    top = (1 << bits) - 1
    low = np.minimum(blocks.min(-1), 0)  # [n, 8]
    step = np.maximum((blocks.max(-1) - low) / top, 1e-8)  # [n, 8]
    d = _f16(step.max(-1) / 63)  # [n]
    dmin = _f16(np.maximum((-low).max(-1), 1e-8) / 63)  # [n]
    sc = np.clip(np.round(step / d[:, None]), 1, 63).astype(np.uint8)  # [n, 8]
    m = np.clip(np.round(-low / dmin[:, None]), 0, 63).astype(np.uint8)  # [n, 8]
    scale = d[:, None] * sc  # [n, 8] float32
    offset = dmin[:, None] * m
    q = np.clip(np.round((blocks + offset[..., None]) / scale[..., None]), 0, top).astype(np.uint8)
    values = (scale[..., None] * q - offset[..., None]).astype(np.float32)  # [n, 8, 32]
    head = [_f16_bytes(d), _f16_bytes(dmin), _pack_scales(sc, m)]
    low_nibbles = q & 0xF  # [n, 8, 32]
    # qs: for sub-block pairs (0,1), (2,3)...: 32 bytes, the first's nibble low.
    qs = (low_nibbles[:, 0::2] | (low_nibbles[:, 1::2] << 4)).reshape(-1, 128)
    if bits == 5:
        high = (q >> 4).astype(np.uint8)  # [n, 8, 32]: bit s of qh[l] is sub-block s's
        qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
        for s in range(8):
            qh |= high[:, s] << s
        head.append(qh)
    return _rows(np.concatenate([*head, qs], axis=1), x), values.reshape(x.shape)


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:  # [n, 8] each -> [n, 12]
    """llama.cpp's get_scale_min_k4, inverted: 6-bit scales and mins in 12 bytes."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def quantize_q6_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K: 16 sub-blocks of 16, value = d * sc * (q - 32), int8 sc, 6-bit q."""
    blocks = _blocks(x).reshape(-1, 16, 16)  # [n, sub-block, 16]
    step = np.maximum(np.abs(blocks).max(-1) / 31, 1e-8)  # [n, 16]
    d = _f16(step.max(-1) / 127)  # [n]
    sc = np.clip(np.round(step / d[:, None]), 1, 127).astype(np.int8)  # [n, 16]
    scale = d[:, None] * sc.astype(np.float32)  # [n, 16]
    q = np.clip(np.round(blocks / scale[..., None]) + 32, 0, 63).astype(np.uint8)
    values = (scale[..., None] * (q.astype(np.float32) - 32)).astype(np.float32)
    # Positions of a 256-block: two halves of 128; in each, l < 32 over four rows
    # of 32 values (y[l], y[l+32], y[l+64], y[l+96]).
    flat = q.reshape(-1, 2, 4, 32)  # [n, half, quarter, l]
    ql = np.concatenate(
        [flat[:, :, 0] & 0xF | (flat[:, :, 2] & 0xF) << 4,
         flat[:, :, 1] & 0xF | (flat[:, :, 3] & 0xF) << 4], axis=2,
    ).reshape(-1, 128)  # fmt: skip
    qh = (flat[:, :, 0] >> 4 | (flat[:, :, 1] >> 4) << 2 | (flat[:, :, 2] >> 4) << 4
          | (flat[:, :, 3] >> 4) << 6).reshape(-1, 64)  # fmt: skip
    packed = np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=1)
    return _rows(packed, x), values.reshape(x.shape)


def _blocks(x: np.ndarray) -> np.ndarray:
    assert x.shape[-1] % QK_K == 0, "rows must be whole 256-value blocks"
    return x.astype(np.float32).reshape(-1, QK_K)


def _rows(packed: np.ndarray, x: np.ndarray) -> np.ndarray:  # [n_blocks, b] -> [rows, bytes]
    return np.ascontiguousarray(packed.astype(np.uint8).reshape(*x.shape[:-1], -1))


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


def _f16_bytes(values: np.ndarray) -> np.ndarray:  # [n] float32 -> [n, 2] uint8
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


K_QUANT_WRITERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def quantized(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF blocks of a random [rows, cols] matrix in `name`."""
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    if name in K_QUANT_WRITERS:
        return K_QUANT_WRITERS[name](values)[0]
    from gguf import GGMLQuantizationType, quants

    return quants.quantize(values, getattr(GGMLQuantizationType, name))
