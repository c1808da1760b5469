"""Calibrate and apply int8 activations (sluice/models/int8_activations.py) to a loaded model.

`quantize_activations(model, token_ids)` runs the model over `token_ids`
(as a prefill in 512-token steps, without logits), records the largest
|x| of every input column of q/k/v, o and gate/up, and gives those matrices
their W8A8 path. The engine calibrates on `calibration_text.txt` (shipped
beside this module: prose, a dialogue, code, lists and numbers; not the
quality gate's text), 1,146 tokens of the embedded model's tokenizer: about
2 s of prefill on 2 cores, so the maxima are kept in the cache directory
(`calibration_file`), keyed by the weights' files, dtype, weight
quantization and the text; a later load reads them back.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from sluice.errors import ModelLoadError
from sluice.models import int8_threshold
from sluice.models.int8_activations import SMOOTHING_ALPHA
from sluice.models.linear import Linear, RowBands
from sluice.models.llama import LlamaForCausalLM
from sluice.models.plan_cache import PlanStore, write_atomically
from sluice.models.scoring import forward_chunks

logger = logging.getLogger(__name__)

CALIBRATION_TEXT = Path(__file__).with_name("calibration_text.txt")
# The decoder matrices that take int8 activations (int8_activations.py says why not down_proj).
INT8_ACTIVATION_MATRICES = ("qkv_proj", "o_proj", "gate_up_proj")
# The row-invariant scheme: every matrix, every step. A8 where int8 codes
# keep the quality; A13 for down_proj and lm_head, whose inputs' outliers
# int8 codes lose (perplexity of the embedded model against float32 on
# tests/data/quality_text.txt, 64-token steps, smoothing 0.5 where not
# said: A8 on the first three alone +0.89% (0.7: +0.28%); with down_proj A8
# +1.71%, A13 +1.13%; A13 everywhere +0.07%; with lm_head A8 +2.29%, A13
# +1.32%; A8 (0.7) on the three, A13 on down_proj and lm_head -0.11%).
ROW_INVARIANT_A8 = INT8_ACTIVATION_MATRICES
ROW_INVARIANT_A13 = ("down_proj", "lm_head")
ROW_INVARIANT_ALPHA = 0.7
# Prefill-sized steps; the decoder's inputs do not depend on the chunking.
_CHUNK_TOKENS = 512


def check_activation_quantization(mode: str | None, device: torch.device) -> None:
    """ModelLoadError (one line) unless `mode` is None or "int8" on a CPU."""
    if mode is None:
        return
    if mode != "int8":
        raise ModelLoadError(f"unknown activation quantization {mode!r}; choose int8 or none")
    if device.type != "cpu":
        raise ModelLoadError(f"int8 activations run on CPU only, not on {device}")


def calibration_text() -> str:
    return CALIBRATION_TEXT.read_text(encoding="utf-8")


def calibration_file(
    cache_dir: Path, weight_files: Sequence[Path], dtype: str, quantization: str | None, text: str,
    row_invariant: bool = False,
) -> Path:  # fmt: skip
    """Where the maxima of this model, in these settings, on `text` are kept."""
    key = hashlib.sha256()
    for path in sorted(weight_files):
        stat = path.stat()
        key.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    matrices = ROW_INVARIANT_A8 + ROW_INVARIANT_A13 if row_invariant else INT8_ACTIVATION_MATRICES
    key.update(f"{dtype}\0{quantization}\0{','.join(matrices)}\0".encode())
    key.update(text.encode())
    return cache_dir / "calibration" / f"input-absmax-{key.hexdigest()[:24]}.pt"


def _targets(model: LlamaForCausalLM, names: Sequence[str]) -> list[Linear]:
    """The matrices `names` of every layer, in layer order (lm_head last)."""
    # An MoE layer has no gate/up or down matrix: its experts keep the model dtype (moe.py).
    found = [
        getattr(layer, name)
        for layer in model.layers
        for name in names
        if name != "lm_head" and hasattr(layer, name)
    ]
    return found + ([model.lm_head] if "lm_head" in names else [])


@torch.no_grad()
def quantize_row_invariant(
    model: LlamaForCausalLM, token_ids: list[int], cache_file: Path | None = None
) -> None:
    """The row-invariant scheme: every matrix, lm_head included, takes int8
    activations times int8 weights at every step (A8 for q/k/v, o and
    gate/up, A13 for down_proj and lm_head), smoothed from `token_ids` (or
    the maxima kept in `cache_file`). Integer sums are exact and one epilogue
    scales them (native/int8_epilogue.h), so a row's bits are the same
    whatever the rows beside it."""
    _check_calibration(model, token_ids)
    a8, a13 = _targets(model, ROW_INVARIANT_A8), _targets(model, ROW_INVARIANT_A13)
    absmax = _maxima(model, a8 + a13, token_ids, cache_file)
    for linear, column_max in zip(a8 + a13, absmax, strict=True):
        pairs = linear in a13
        alpha = SMOOTHING_ALPHA if pairs else ROW_INVARIANT_ALPHA
        linear.quantize_activations(column_max, every_row=True, pairs=pairs, alpha=alpha)
    model.activation_quantization = "int8"


def _check_calibration(model: LlamaForCausalLM, token_ids: list[int]) -> None:
    if not model.is_loaded:
        raise ModelLoadError("int8 activations need the weights loaded first")
    if model.batch_invariant:
        raise ModelLoadError("int8 activations do not apply in batch-invariant mode")
    if len(token_ids) < 2:
        raise ModelLoadError("int8 activations need a calibration text of 2 tokens or more")


def _maxima(
    model: LlamaForCausalLM, targets: list[Linear], token_ids: list[int], cache_file: Path | None
) -> list[Tensor]:
    """Each target's max |x| per input column: kept in `cache_file`, or measured and kept."""
    absmax = _read(cache_file, targets)
    if absmax is None:
        measured = input_absmax(model, targets, token_ids)
        absmax = [measured[linear] for linear in targets]
        _write(cache_file, absmax)
    return absmax


@torch.no_grad()
def quantize_activations(
    model: LlamaForCausalLM, token_ids: list[int], cache_file: Path | None = None
) -> RowBands:
    """Give q/k/v, o and gate/up of every layer int8 activations, smoothed from
    `token_ids` (or from the maxima kept in `cache_file`, when it holds them),
    from their own threshold on (an execution plan's W8A8 bands, raced by
    `race_w8a8`, then narrow them: plan_apply.py). Returns the bands of rows
    W8A8 serves."""
    _check_calibration(model, token_ids)
    targets = _targets(model, INT8_ACTIVATION_MATRICES)
    absmax = _maxima(model, targets, token_ids, cache_file)
    for linear, column_max in zip(targets, absmax, strict=True):
        linear.quantize_activations(column_max)
    model.activation_quantization = "int8"
    return targets[0].int8_row_bands


def race_w8a8(model: LlamaForCausalLM, store: PlanStore | None = None) -> RowBands:
    """The bands of rows W8A8 (`quantize_activations`) is to serve against
    AMX bfloat16, raced on the middle layer's matrices or read from `store`
    (int8_threshold.py): a value for the execution plan; nothing is rebound."""
    per_layer = len(INT8_ACTIVATION_MATRICES)
    targets = _targets(model, INT8_ACTIVATION_MATRICES)
    middle = len(model.layers) // 2 * per_layer
    return int8_threshold.race_against_amx(targets[middle : middle + per_layer], store)


def _read(cache_file: Path | None, targets: list[Linear]) -> list[Tensor] | None:
    """The kept maxima, if `cache_file` holds one [in] float32 tensor per target."""
    if cache_file is None or not cache_file.exists():
        return None
    try:
        kept = torch.load(cache_file, weights_only=True)
    except Exception as error:  # noqa: BLE001 - a damaged file is measured again
        logger.warning("calibration cache %s unreadable (%s); measuring again", cache_file, error)
        return None
    fits = (
        isinstance(kept, list)
        and len(kept) == len(targets)
        and all(
            isinstance(t, Tensor)
            and t.dtype == torch.float32
            and t.shape == linear.weight.shape[1:]
            for t, linear in zip(kept, targets, strict=True)
        )
    )
    return kept if fits else None


def _write(cache_file: Path | None, absmax: list[Tensor]) -> None:
    if cache_file is not None:
        write_atomically(
            cache_file, lambda scratch: torch.save(absmax, scratch), "calibration cache"
        )


def input_absmax(
    model: LlamaForCausalLM,
    linears: list[Linear],
    token_ids: list[int],
    chunk_tokens: int = _CHUNK_TOKENS,
) -> dict[Linear, Tensor]:
    """max |x| per input column [in] (float32) of each of `linears` over
    `token_ids`, cut to the model's positions."""
    token_ids = token_ids[: model.config.max_position_embeddings]
    seen: dict[Linear, Tensor] = {}

    def record(linear, inputs) -> None:
        column_max = inputs[0].detach().abs().amax(dim=0).float()  # [in]
        previous = seen.get(linear)
        seen[linear] = column_max if previous is None else torch.maximum(previous, column_max)

    hooks = [linear.register_forward_pre_hook(record) for linear in linears]
    try:
        for _start, _end, hidden in forward_chunks(model, token_ids, chunk_tokens):
            if model.lm_head in linears:
                model.lm_head(hidden)
    finally:
        for hook in hooks:
            hook.remove()
    return seen
