"""What `--dtype auto` and `--quantization auto` become on this machine.

The defaults are the product: a user who runs `sluice serve` with no flags
gets the fastest setting that does not cost quality they would notice.

- dtype: bfloat16 where the hardware multiplies it natively (a CPU with
  AVX512-BF16 or AMX-BF16, or a CUDA device); float32 elsewhere, where
  bfloat16 matmuls are emulated and slower than float32 ones.
- quantization: weight-only int4 (groups of 32, scale and zero: llama.cpp's
  Q4_1 layout) when the weights themselves came in 4 bits (a Q4_0/Q4_1/Q4_K
  GGUF, such as the embedded model): those values fit the int4 grid, so the
  copy loses next to nothing more, and small decode batches read 4x fewer
  bytes. Weights that came in more bits stay unquantized unless asked:
  re-quantizing them costs quality (`tests/test_quality_gate.py` holds the
  default within 1% of float32's perplexity).
- the row-invariant scheme (the default where it can run: bfloat16 on a CPU
  with the native AVX512-VNNI int8 matmul, `--quantization` and
  `--activation-quantization` left at auto): every matrix, lm_head included,
  at every step, multiplies int8 activation codes by int8 weights with exact
  integer sums (sluice/models/calibration.py `quantize_row_invariant`), so a
  request's bits never depend on the rows beside it (issue 28); no
  weight-only copy.
- otherwise, activations: int8 (W8A8: int8 activations times int8 weights, for steps of
  more than a few tokens; sluice/models/int8_activations.py) on a CPU with
  VNNI (AVX512-VNNI, AVX-VNNI or AMX-INT8) when the weights are quantized
  too: decode steps of 8 to 64 tokens run 1.23-1.28x faster with
  AVX512-VNNI (from 4 tokens on; 40 with the other two), within the same 1%.
  On a CPU with AMX-BF16 the dense bfloat16 matmul runs on AMX tiles, so
  the load races the two in every band of rows (sluice/models/int8_threshold.py):
  `after_amx_race` puts the bands W8A8 won, or W8A8 off, into the reason,
  in place of the reason given before the race.

Every choice comes with its reason, which the engine prints at startup; an
explicit `--dtype`, `--quantization` or `--activation-quantization` always wins.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sluice.models.int8_threshold import describe_bands
from sluice.models.linear import RowBands
from sluice.models.native.int8 import int8_gemm_kernels

AUTO = "auto"
# `--quantization gguf`: a GGUF's matrices stay in the file's blocks (loader/gguf_tensors.py).
GGUF_BLOCKS = "gguf"
_GGUF_BLOCKS = (
    "GGUF blocks kept as the file has them: int8 activations times the blocks' codes at "
    "every step, exact integer sums per block (llama.cpp's arithmetic; row-invariant)"
)
# `--quantization q4_k_m` / `q8_0`: an HF checkpoint's matrices quantized at load
# into those GGUF blocks (loader/hf_blocks.py), then run as a GGUF's are.
HF_BLOCKS = {
    "q4_k_m": "Q4_K_M blocks quantized at load (Q4_K; Q6_K for lm_head and the v/down "
    "matrices of some layers, as llama-quantize)",
    "q8_0": "Q8_0 blocks quantized at load",
}
_HF_BLOCKS = (
    ": int8 activations times the blocks' codes at every step, exact integer sums per "
    "block (row-invariant)"
)
# GGUF tensor types by the bits per weight of their values' grid.
_GGUF_TYPE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5,
                   "Q6_K": 6, "Q8_0": 8, "Q8_K": 8, "F16": 16, "BF16": 16, "F32": 32}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelChoices:
    dtype: str
    # None: the model dtype's own weights.
    quantization: str | None
    # One line for the startup log: what was chosen and why.
    reason: str
    # "int8": W8A8 for all but the smallest steps (every step when
    # `row_invariant`); None: activations in the model dtype.
    activations: str | None = None
    # The row-invariant scheme (module docstring): int8 x int8 at every step.
    row_invariant: bool = False


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def has_native_bf16(device: torch.device, flags: frozenset[str]) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def decoder_weight_bits(gguf_tensor_types: dict[str, str] | None) -> int | None:
    """The fewest bits per weight among a GGUF's decoder matrices; None if unknown."""
    if not gguf_tensor_types:
        return None
    bits = [
        _GGUF_TYPE_BITS.get(kind, 32)
        for name, kind in gguf_tensor_types.items()
        if name.startswith("blk.") and name.endswith(".weight") and "norm" not in name
    ]
    return min(bits, default=None)


def choose(
    dtype: str,
    quantization: str | None,
    device: torch.device,
    weight_bits: int | None,
    flags: frozenset[str] | None = None,
    activations: str | None = None,
    int8_gemm: bool | None = None,
    kept_experts: str | None = None,
) -> ModelChoices:
    """Resolve "auto" in `dtype`, `quantization` and `activations`; explicit
    values pass through. `int8_gemm`: whether the native int8 matmul runs here
    (None: ask the kernels). `kept_experts`: the 4-bit format a checkpoint's
    experts stay in whatever is chosen ("MXFP4": gpt-oss), else None."""
    flags = cpu_flags() if flags is None else flags
    reasons = []
    if dtype == AUTO:
        if has_native_bf16(device, flags):
            dtype = "bfloat16"
            reasons.append(f"bfloat16: {_bf16_hardware(device, flags)}")
        else:
            dtype = "float32"
            reasons.append("float32: no native bfloat16 matmul on this hardware")
    if quantization == GGUF_BLOCKS:
        reasons.append(_GGUF_BLOCKS)
        return ModelChoices(dtype, GGUF_BLOCKS, "; ".join(reasons), None)
    if quantization in HF_BLOCKS:
        reasons.append(HF_BLOCKS[quantization] + _HF_BLOCKS)
        return ModelChoices(dtype, quantization, "; ".join(reasons), None)
    if quantization == AUTO and activations == AUTO and device.type == "cpu":
        if int8_gemm is None:
            int8_gemm = int8_gemm_kernels() is not None
        if dtype == "bfloat16" and int8_gemm:
            reasons.append(_ROW_INVARIANT + _int8_hardware(flags))
            return ModelChoices(dtype, None, "; ".join(reasons), "int8", row_invariant=True)
    if quantization == AUTO:
        if device.type == "cpu" and weight_bits is not None and weight_bits <= 4:
            quantization = "int4"
            reasons.append(f"int4: the weights came in {weight_bits} bits")
        else:
            quantization = None
            why = _why_not_int4(device, weight_bits)
            if kept_experts:
                why = f"experts in {kept_experts} as the checkpoint has them, the rest unquantized: {why}"
            else:
                why = "no quantization: " + why
            reasons.append(why)
    if activations == AUTO:
        activations = None
        if device.type == "cpu" and quantization is not None and (vnni := _vnni(flags)):
            activations = "int8"
            reasons.append(f"int8 activations in steps of several tokens: the CPU has {vnni}")
    return ModelChoices(dtype, quantization, "; ".join(reasons) or "as asked", activations)


def after_amx_race(chosen: ModelChoices, bands: RowBands) -> ModelChoices:
    """`chosen` once W8A8 raced the AMX bfloat16 matmul in every band of rows
    at load (sluice/models/int8_threshold.py): the activations and their
    reason say what the race chose (W8A8 in `bands`, or off where it won
    none); the reason `choose` gave before the race goes."""
    kept = [part for part in chosen.reason.split("; ") if not part.startswith("int8 activations")]
    if not bands:
        why = "int8 activations off: they lost to AMX bfloat16 in every band of rows at load"
        return replace(chosen, activations=None, reason="; ".join([*kept, why]))
    why = (
        f"int8 activations at {describe_bands(bands)}, AMX bfloat16 elsewhere: "
        "raced in every band at load"
    )
    return replace(chosen, reason="; ".join([*kept, why]))


def noting(chosen: ModelChoices, note: str) -> ModelChoices:
    """`chosen` with `note` (what else the load decided: the native kernels,
    the kernel plan) at the end of its reason, for the startup line."""
    return replace(chosen, reason=f"{chosen.reason}; {note}")


_ROW_INVARIANT = (
    "row-invariant int8 matmuls: int8 activations (13-bit for down_proj and lm_head) times "
    "int8 weights at every step, exact integer sums, so a request's bits ignore the rows "
    "beside it; "
)


def _int8_hardware(flags: frozenset[str]) -> str:
    if "amx_int8" in flags:
        return "AVX512-VNNI for small steps, AMX-INT8 tiles for large ones"
    return "AVX512-VNNI"


def _vnni(flags: frozenset[str]) -> str | None:
    """The CPU's int8 dot-product instructions, by name; None without."""
    names = {"amx_int8": "AMX-INT8", "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI"}
    return next((name for flag, name in names.items() if flag in flags), None)


def _bf16_hardware(device: torch.device, flags: frozenset[str]) -> str:
    if device.type == "cuda":
        return "the GPU has it"
    return "the CPU has AMX-BF16" if "amx_bf16" in flags else "the CPU has AVX512-BF16"


def _why_not_int4(device: torch.device, weight_bits: int | None) -> str:
    if device.type != "cpu":
        return "weight-only int4 runs on CPU only"
    if weight_bits is None:
        return "the weights came unquantized (ask with --quantization int4 or int8)"
    return f"the weights came in {weight_bits} bits (ask with --quantization int4 or int8)"
