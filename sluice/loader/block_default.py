"""Whether `--quantization auto` keeps a GGUF's blocks (issue 41).

A GGUF of at least `BLOCKS_FROM_BYTES` (512 MiB: the 1B-and-larger files
people serve on CPUs), of an architecture the block path serves, whose every
decoder matrix is in a block format the qblock kernel reads (routers aside,
which load in float32; gpt-oss's MXFP4 experts count), on a CPU where
that kernel runs, keeps its blocks by default (`--quantization gguf`): int8
activations times the file's own codes, exact integer sums per block,
row-invariant like the default it replaces. The alternative, the
row-invariant int8 copy, holds about 3.7x the file's bytes in memory (an 8B
Q4_K_M file would not fit 24 GB), converts through float32 on disk first,
and decodes one stream slower; on 16 and 64 rows a whole 1B layer runs at
about its speed (benchmarks/qblock_gemm.py: Q4_K 0.8x on the 2048-wide
projections, 1.5x on down_proj, where the copy pays for A13 pairs).

Smaller files keep the int8 copy: the embedded 135M model and Gemma 3 270M
lose little memory to it, and its batched matmuls are faster on their
narrow shapes. An explicit `--quantization` always wins.

An HF checkpoint follows the same rule, judged by the same measure: its size
in 4-bit blocks (about a Q4_K_M GGUF's bytes, from the safetensors headers:
loader/hf_blocks.four_bit_bytes), for the HF model types of the same
architectures, where the kernel runs. From the bound on it is quantized at
load to Q4_K_M blocks (`--quantization q4_k_m`: loader/hf_blocks.py); a
checkpoint that came quantized (a `quantization_config`) is left alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.loader.choices import AUTO, GGUF_BLOCKS
from sluice.loader.hf_blocks import Q4_K_M, four_bit_bytes
from sluice.loader.sources import ModelSource
from sluice.loader.weights import checkpoint_files
from sluice.models.block_codes import FORMATS
from sluice.models.native.qblock import qblock_available

if TYPE_CHECKING:
    from gguf import GGUFReader

BLOCKS_FROM_BYTES = 512 * 2**20
# GGUF architectures whose block path the suite proves (test_models_qblock_model.py,
# test_models_moe_blocks.py): the llama decoder's families and Qwen3-MoE.
# gpt-oss's expert stacks are MXFP4 in every published GGUF: they stay in 4 bits
# on either path (loader/gguf_mxfp4.py), so they count as blocks here.
BLOCK_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "qwen3moe", "gpt-oss"})
# The HF model types of the dense ones (config.json's model_type), which an HF
# checkpoint quantizes to (loader/hf_blocks.py).
HF_BLOCK_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3"})


class GgufHeader:
    """A GGUF file opened at its first use and then kept: a load parses the
    header once, for the decision here and for the blocks it then reads
    (gguf_tensors.gguf_weights), and never where neither needs it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._reader: GGUFReader | None = None

    def reader(self) -> GGUFReader:
        """The parsed file (its header read on the first call only)."""
        if self._reader is None:
            from gguf import GGUFReader

            self._reader = GGUFReader(self.path)
        return self._reader


def blocks_by_default(
    path: Path,
    *,
    from_bytes: int | None = None,
    kernel_runs: Callable[[], bool] | None = None,
    header: GgufHeader | None = None,
) -> str | None:
    """Why auto keeps this GGUF's blocks (a phrase for the startup line), or
    None where auto keeps today's int8 copy. Reads only the file's header.
    `from_bytes`: the size bound (None: `BLOCKS_FROM_BYTES`); `kernel_runs`:
    whether the qblock kernel runs here (None: ask it); `header`: the file,
    opened once for the whole load (None: opened here)."""
    from_bytes = BLOCKS_FROM_BYTES if from_bytes is None else from_bytes
    kernel_runs = qblock_available if kernel_runs is None else kernel_runs
    size = path.stat().st_size
    if size < from_bytes or not kernel_runs():
        return None
    from sluice.loader.gguf_llama import family

    try:
        reader = (header or GgufHeader(path)).reader()
    except Exception:  # a corrupt file: the load that follows names the error
        return None
    field = reader.fields.get("general.architecture")
    architecture = None if field is None else field.contents()
    if architecture not in BLOCK_ARCHITECTURES:
        return None
    gguf = family(reader).gguf
    kept = FORMATS.keys() | ({"MXFP4"} if gguf is not None and gguf.release_experts else set())
    matrices = [
        tensor.tensor_type.name
        for tensor in reader.tensors
        # Weights, not biases (gpt-oss's experts have [E, out] ones); a router
        # loads in float32 on every path (moe.py), and llama-quantize leaves it F32.
        if tensor.name.startswith("blk.") and tensor.name.endswith(".weight")
        and len(tensor.shape) >= 2 and ".ffn_gate_inp." not in tensor.name
    ]  # fmt: skip
    if not matrices or any(name not in kept for name in matrices):
        return None
    return (
        f"auto: a {size / 2**20:,.0f} MiB GGUF keeps its blocks (from "
        f"{from_bytes / 2**20:,.0f} MiB; an int8 copy would hold ~4x its bytes)"
    )


def resolve_quantization(
    quantization: str | None, source: ModelSource, header: GgufHeader | None = None
) -> tuple[str | None, str | None]:
    """`quantization` with auto resolved to "gguf" where `blocks_by_default`
    says so, and its reason (None where nothing was resolved here): the one
    decision the engine's load and the server's reading of the tokenizer share.
    `header`: a GGUF source opened once for the whole load (None: opened here)."""
    if quantization != AUTO:
        return quantization, None
    if source.kind == "hf_folder":
        reason = hf_blocks_by_default(source.path)
        return (Q4_K_M, reason) if reason else (quantization, None)
    reason = blocks_by_default(source.path, header=header)
    return (GGUF_BLOCKS, reason) if reason else (quantization, None)


def hf_blocks_by_default(
    folder: Path,
    *,
    from_bytes: int | None = None,
    kernel_runs: Callable[[], bool] | None = None,
) -> str | None:
    """Why auto quantizes this HF checkpoint to Q4_K_M blocks at load (a phrase
    for the startup line), or None where auto keeps the int8 copy: the GGUF
    rule, the checkpoint judged by its size in 4-bit blocks. Reads only
    config.json and the safetensors headers."""
    from_bytes = BLOCKS_FROM_BYTES if from_bytes is None else from_bytes
    kernel_runs = qblock_available if kernel_runs is None else kernel_runs
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if config.get("model_type") not in HF_BLOCK_MODEL_TYPES or "quantization_config" in config:
            return None
        size = four_bit_bytes(checkpoint_files(folder))
    except Exception:  # a broken folder: the load that follows names the error
        return None
    if size < from_bytes or not kernel_runs():
        return None
    return (
        f"auto: a checkpoint of {size / 2**20:,.0f} MiB in 4-bit blocks is quantized to "
        f"Q4_K_M at load (from {from_bytes / 2**20:,.0f} MiB, as a GGUF keeps its blocks; "
        "an int8 copy would hold ~2x its bytes)"
    )
