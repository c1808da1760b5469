"""Float matrices quantized into GGUF blocks, in llama.cpp's byte layout.

An HF checkpoint loaded at 4 bits (loader/hf_blocks.py) goes through here
one matrix at a time: `quantize_rows` turns float rows into the bytes a GGUF
file would hold for them (ggml-common.h's block_q8_0, block_q4_0,
block_q4_K, block_q6_K), which loader/gguf_blocks.decode_blocks reads as any
GGUF's, so the kernel sees exactly what a file would give it. Vectorized in
torch over every block of a chunk of rows.

- Q8_0, Q4_0 and Q5_0: llama.cpp's reference quantizers
  (quantize_row_q8_0_ref, ..._q4_0_ref, ..._q5_0_ref), bit for bit as
  gguf-py's (tests check it).
- Q4_K: llama.cpp's quantize_row_q4_K_ref, its search vectorized: each
  sub-block of 32 tries `Q4_K_STEPS` + 1 scales around (max - min) / 15,
  rounds, refits scale and min by weighted least squares (weights
  sqrt(mean x^2) + |x|, as make_qkx2_quants) and keeps the candidate of least
  weighted error; the eight scales and mins of a super-block are then
  quantized to 6 bits against the largest, and the codes rounded again
  against the 6-bit values. llama.cpp searches 20 steps; 2 keep the load
  quicker (each step is a pass over the matrix): relative squared error on
  Gaussian rows 0.00543 against its 0.00515 (0 steps, the refit alone:
  0.00574; 4: 0.00525; 8: 0.00518).
- Q6_K: one fixed scale per sub-block of 16 (the value of largest magnitude
  maps to -32, as make_qx_quants' starting point, without its search), the
  16 scales quantized to int8 against the largest, codes rounded again.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

Q4_K_STEPS = 2
QK_K = 256
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210}
BLOCK_VALUES = {"Q8_0": 32, "Q4_0": 32, "Q5_0": 32, "Q4_K": QK_K, "Q6_K": QK_K}
_CHUNK_VALUES = 1 << 22  # values quantized per pass: bounds the temporaries


def quantize_rows(weight: Tensor, type_name: str) -> np.ndarray:
    """`weight` [rows, cols] (any float dtype) -> uint8 [rows, cols / block *
    block_bytes]: the GGUF bytes of `type_name`, row after row."""
    rows, cols = weight.shape
    if cols % BLOCK_VALUES[type_name]:
        raise ValueError(f"{type_name} needs rows of whole blocks; these have {cols} values")
    encode = _ENCODERS[type_name]
    out = np.empty((rows, cols // BLOCK_VALUES[type_name] * BLOCK_BYTES[type_name]), np.uint8)
    step = max(1, _CHUNK_VALUES // cols)
    for start in range(0, rows, step):
        chunk = weight[start : start + step].to(torch.float32)
        out[start : start + step] = encode(chunk.reshape(-1, BLOCK_VALUES[type_name])).reshape(
            chunk.shape[0], -1
        )
    return out


def _f16_bytes(values: Tensor) -> Tensor:  # [n] float32 -> [n, 2] uint8
    return values.to(torch.float16).view(torch.uint8).reshape(-1, 2)


def _round_away(x: Tensor) -> Tensor:
    """Round half away from zero (C's roundf; gguf-py's np_roundf)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _nearest_int(x: Tensor) -> Tensor:
    """llama.cpp's nearest_int: round half to even (the float trick)."""
    return torch.round(x)


def _q8_0(blocks: Tensor) -> np.ndarray:  # [n, 32]
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = _round_away(blocks * inverse).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(d.reshape(-1)), q], dim=1).numpy()


def _q4_0(blocks: Tensor) -> np.ndarray:  # [n, 32]
    index = blocks.abs().argmax(dim=1, keepdim=True)
    d = torch.gather(blocks, 1, index) / -8
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(blocks * inverse + 8.5).clamp(0, 15).to(torch.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([_f16_bytes(d.reshape(-1)), packed], dim=1).numpy()


def _q5_0(blocks: Tensor) -> np.ndarray:  # [n, 32]
    index = blocks.abs().argmax(dim=1, keepdim=True)
    d = torch.gather(blocks, 1, index) / -16
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(blocks * inverse + 16.5).clamp(max=31).to(torch.uint8)
    packed = (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)
    high = (q >> 4).to(torch.int64) << torch.arange(32)  # bit j: value j's fifth bit
    qh = high.sum(dim=1).to(torch.int32).view(torch.uint8).reshape(-1, 4)  # little-endian u32
    return torch.cat([_f16_bytes(d.reshape(-1)), qh, packed], dim=1).numpy()


def _affine_search(x: Tensor, nmax: int) -> tuple[Tensor, Tensor]:
    """make_qkx2_quants over rows of x [n, 32]: (scale, min) per row, with
    x ~ scale * L - min, L in [0, nmax], min >= 0."""
    weights = x.pow(2).mean(dim=1, keepdim=True).sqrt() + x.abs()
    low = x.amin(dim=1, keepdim=True).clamp(max=0)
    high = x.amax(dim=1, keepdim=True)
    span = (high - low).clamp(min=1e-30)
    flat = high == low  # one value: scale 0, min -low
    best_scale, best_min = (span / nmax), low
    best_error = _error(x, weights, best_scale, best_min, nmax, 1 / best_scale)
    sum_w, sum_x = weights.sum(1, keepdim=True), (weights * x).sum(1, keepdim=True)
    for levels in _candidates(nmax):
        codes = torch.round(levels / span * (x - low))
        codes = codes.clamp(0, nmax)
        sum_l = (weights * codes).sum(1, keepdim=True)
        sum_l2 = (weights * codes * codes).sum(1, keepdim=True)
        sum_xl = (weights * codes * x).sum(1, keepdim=True)
        det = sum_w * sum_l2 - sum_l * sum_l
        safe = torch.where(det > 0, det, torch.ones_like(det))
        scale = (sum_w * sum_xl - sum_x * sum_l) / safe
        minimum = (sum_l2 * sum_x - sum_l * sum_xl) / safe
        positive = minimum > 0  # llama.cpp clamps the min at 0 and refits the scale
        minimum = torch.where(positive, torch.zeros_like(minimum), minimum)
        scale = torch.where(positive, sum_xl / sum_l2.clamp(min=1e-30), scale)
        error = ((scale * codes + minimum - x).pow(2) * weights).sum(1, keepdim=True)
        better = (det > 0) & (error < best_error)
        best_scale = torch.where(better, scale, best_scale)
        best_min = torch.where(better, minimum, best_min)
        best_error = torch.where(better, error, best_error)
    best_scale = torch.where(flat, torch.zeros_like(best_scale), best_scale)
    return best_scale.reshape(-1), -best_min.reshape(-1)


def _candidates(nmax: int) -> list[float]:
    """The code ranges tried: llama.cpp's from nmax - 1 to nmax + 1 (rmin -1,
    rdelta 0.1, 20 steps), here in `Q4_K_STEPS` steps; nmax alone at 0."""
    if Q4_K_STEPS == 0:
        return [float(nmax)]
    return [nmax - 1 + 2 * step / Q4_K_STEPS for step in range(Q4_K_STEPS + 1)]


def _error(x, weights, scale, minimum, nmax, inverse) -> Tensor:
    codes = torch.round((x - minimum) * inverse).clamp(0, nmax)
    return ((scale * codes + minimum - x).pow(2) * weights).sum(1, keepdim=True)


def _q4_k(blocks: Tensor) -> np.ndarray:  # [n, 256]
    n = blocks.shape[0]
    sub = blocks.reshape(n * 8, 32)
    scales, mins = (t.reshape(n, 8) for t in _affine_search(sub, 15))
    max_scale, max_min = scales.amax(1, keepdim=True), mins.amax(1, keepdim=True)
    inv_scale = torch.where(max_scale > 0, 63 / max_scale, torch.zeros_like(max_scale))
    inv_min = torch.where(max_min > 0, 63 / max_min, torch.zeros_like(max_min))
    ls = _nearest_int(inv_scale * scales).clamp(max=63).to(torch.uint8)
    lm = _nearest_int(inv_min * mins).clamp(max=63).to(torch.uint8)
    d = (max_scale / 63).to(torch.float16).to(torch.float32)
    dmin = (max_min / 63).to(torch.float16).to(torch.float32)
    step = (d * ls).unsqueeze(2)  # [n, 8, 1]
    offset = (dmin * lm).unsqueeze(2)
    inverse = torch.where(step > 0, 1 / step, torch.zeros_like(step))
    codes = _nearest_int((blocks.reshape(n, 8, 32) + offset) * inverse).clamp(0, 15)
    codes = codes.to(torch.uint8).reshape(n, 4, 2, 32)
    packed = (codes[:, :, 0] | (codes[:, :, 1] << 4)).reshape(n, 128)
    return torch.cat([_f16_bytes(d), _f16_bytes(dmin), _pack_k4_scales(ls, lm), packed], 1).numpy()


def _pack_k4_scales(ls: Tensor, lm: Tensor) -> Tensor:
    """Eight 6-bit scales and mins into 12 bytes (inverse of get_scale_min_k4)."""
    low = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    mid = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    high = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return torch.cat([low, mid, high], dim=1)


def _q6_k(blocks: Tensor) -> np.ndarray:  # [n, 256]
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    index = sub.abs().argmax(dim=2, keepdim=True)
    scales = (torch.gather(sub, 2, index) / -32).squeeze(2)  # [n, 16]
    largest = torch.gather(scales, 1, scales.abs().argmax(1, keepdim=True))
    inverse = torch.where(largest != 0, -128 / largest, torch.zeros_like(largest))
    sc = _nearest_int(inverse * scales).clamp(max=127).to(torch.int8)
    d = torch.where(largest != 0, 1 / inverse, torch.zeros_like(largest))
    d = d.to(torch.float16).to(torch.float32)
    step = (d * sc).unsqueeze(2)
    step_inverse = torch.where(step != 0, 1 / step, torch.zeros_like(step))
    codes = (_nearest_int(sub * step_inverse).clamp(-32, 31) + 32).to(torch.uint8)
    return torch.cat(
        [_q6_k_values(codes.reshape(n, QK_K)), sc.view(torch.uint8), _f16_bytes(d)], 1
    ).numpy()


def _q6_k_values(codes: Tensor) -> Tensor:  # [n, 256] in [0, 64) -> ql [n, 128] + qh [n, 64]
    n = codes.shape[0]
    halves = codes.reshape(n, 2, 4, 32)  # quarters at l, l+32, l+64, l+96 of each half
    low, high = halves & 0xF, halves >> 4
    ql = torch.cat([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], 2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return torch.cat([ql.reshape(n, 128), qh.reshape(n, 64)], dim=1)


_ENCODERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q5_0": _q5_0, "Q4_K": _q4_k, "Q6_K": _q6_k}
