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
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from sluice.errors import ModelLoadError
from sluice.models import int8_threshold
from sluice.models.linear import Linear, RowBands
from sluice.models.llama import LlamaForCausalLM
from sluice.models.scoring import forward_chunks

logger = logging.getLogger(__name__)

CALIBRATION_TEXT = Path(__file__).with_name("calibration_text.txt")
# The decoder matrices that take int8 activations (int8_activations.py says why not down_proj).
INT8_ACTIVATION_MATRICES = ("qkv_proj", "o_proj", "gate_up_proj")
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
    cache_dir: Path, weight_files: Sequence[Path], dtype: str, quantization: str | None, text: str
) -> Path:
    """Where the maxima of this model, in these settings, on `text` are kept."""
    key = hashlib.sha256()
    for path in sorted(weight_files):
        stat = path.stat()
        key.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    key.update(f"{dtype}\0{quantization}\0{','.join(INT8_ACTIVATION_MATRICES)}\0".encode())
    key.update(text.encode())
    return cache_dir / "calibration" / f"input-absmax-{key.hexdigest()[:24]}.pt"


@torch.no_grad()
def quantize_activations(
    model: LlamaForCausalLM, token_ids: list[int], cache_file: Path | None = None,
    race_against_amx: bool = False,
) -> RowBands:  # fmt: skip
    """Give q/k/v, o and gate/up of every layer int8 activations, smoothed from
    `token_ids` (or from the maxima kept in `cache_file`, when it holds them),
    from their own threshold on, or (`race_against_amx`) in the bands of rows
    raced at load (int8_threshold.py). Returns the bands of rows W8A8 serves;
    none where it lost every band and was dropped."""
    if not model.is_loaded:
        raise ModelLoadError("int8 activations need the weights loaded first")
    if model.batch_invariant:
        raise ModelLoadError("int8 activations do not apply in batch-invariant mode")
    if len(token_ids) < 2:
        raise ModelLoadError("int8 activations need a calibration text of 2 tokens or more")
    targets = [getattr(layer, name) for layer in model.layers for name in INT8_ACTIVATION_MATRICES]
    absmax = _read(cache_file, targets)
    if absmax is None:
        measured = input_absmax(model, targets, token_ids)
        absmax = [measured[linear] for linear in targets]
        _write(cache_file, absmax)
    for linear, column_max in zip(targets, absmax, strict=True):
        linear.quantize_activations(column_max)
    if race_against_amx:
        per_layer = len(INT8_ACTIVATION_MATRICES)
        middle = len(model.layers) // 2 * per_layer
        kept_dir = None if cache_file is None else cache_file.parent
        int8_threshold.race_against_amx(targets[middle : middle + per_layer], targets, kept_dir)
    kept_w8a8 = targets[0].int8_activations is not None
    model.activation_quantization = "int8" if kept_w8a8 else None
    return targets[0].int8_row_bands


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
    if cache_file is None:
        return
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # Written beside the target, then renamed: a reader never sees half a file.
        with tempfile.NamedTemporaryFile(dir=cache_file.parent, delete=False) as scratch:
            torch.save(absmax, scratch)
        os.replace(scratch.name, cache_file)
    except OSError as error:
        logger.warning("calibration cache %s not written: %s", cache_file, error)


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
        for _chunk in forward_chunks(model, token_ids, chunk_tokens):
            pass
    finally:
        for hook in hooks:
            hook.remove()
    return seen
