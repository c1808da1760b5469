"""The load's middle steps: the matrices in the forms the choices ask, then the execution plan.

`prepare_weights` gives a filled model's matrices their forms (a weight-only
copy, int8 activations calibrated: the row-invariant scheme or W8A8 from its
own threshold; a GGUF's blocks are already adopted). `resolve_plan` then
decides the execution plan on those weights without rebinding anything: the
W8A8 bands raced against AMX bfloat16 and the kernel plan, each measured or
read from the plan cache (one key, one writer: plan_cache.py). load_model
hands the plan to `plan_apply.apply`, the one place layers take it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sluice.config import ModelConfig
from sluice.loader import choices
from sluice.models import calibration
from sluice.models.execution_plan import ExecutionPlan
from sluice.models.kernel_plan import measured_lengths
from sluice.models.kernel_race import int8_candidates, plan_kernels
from sluice.models.llama import LlamaForCausalLM
from sluice.models.plan_cache import PlanStore, model_key
from sluice.tokenizer import Tokenizer


def prepare_weights(
    model: LlamaForCausalLM,
    chosen: choices.ModelChoices,
    config: ModelConfig,
    files: list[Path],
    tokenizer: Tokenizer,
    keep_blocks: bool,
) -> None:
    """The loaded model's matrices as `chosen` asks: GGUF blocks stay as
    adopted; a weight-only copy; int8 activations calibrated (the maxima
    kept in the cache directory: calibration.py)."""
    if not keep_blocks and chosen.quantization is not None:
        model.quantize(chosen.quantization)
    if chosen.activations != "int8":
        return
    text = calibration.calibration_text()
    kept = calibration.calibration_file(
        config.cache_dir, files, chosen.dtype, chosen.quantization, text, chosen.row_invariant
    )
    if chosen.row_invariant:
        calibration.quantize_row_invariant(model, tokenizer.encode(text), kept)
    else:
        calibration.quantize_activations(model, tokenizer.encode(text), kept)


def resolve_plan(
    config: ModelConfig,
    model: LlamaForCausalLM,
    chosen: choices.ModelChoices,
    store: PlanStore,
    max_model_len: int,
    blocks: str,
) -> tuple[choices.ModelChoices, ExecutionPlan]:
    """The execution plan of the prepared `model` (module docstring), from
    `store` (`open_store`) or measured and kept there, and `chosen` as the
    W8A8 race left it; `blocks`: the blocks the weights stay in ("" for
    none). On another device only the blocks apply."""
    w8a8_bands = None
    if _races_amx(chosen):  # with AMX the bfloat16 matmul runs on its tiles
        w8a8_bands = calibration.race_w8a8(model, store)
        chosen = choices.after_amx_race(chosen, w8a8_bands)
    plan = ExecutionPlan(None, w8a8_bands, blocks=blocks)
    if model.embed_tokens.device.type != "cpu":
        return chosen, plan
    kernels = None  # batch-invariant mode keeps its own attention path
    if not config.batch_invariant:
        kernels = plan_kernels(
            store, model.config, model.dtype, max_model_len, int8_candidates(model)
        )
    return chosen, dataclasses.replace(plan, kernels=kernels, not_kept=store.save())


def _races_amx(chosen: choices.ModelChoices) -> bool:
    """W8A8 from its own threshold races AMX bfloat16 where the CPU has it
    (int8_threshold.py); the row-invariant scheme serves every row."""
    return (
        chosen.activations == "int8"
        and not chosen.row_invariant
        and chosen.dtype == "bfloat16"
        and "amx_bf16" in choices.cpu_flags()
    )


def open_store(
    config: ModelConfig, model: LlamaForCausalLM, chosen: choices.ModelChoices, max_model_len: int
) -> PlanStore:
    """The execution plan kept for this CPU and model, read once
    (plan_cache.py), before `prepare_weights`: its key reads the middle
    layer's parameters as loaded."""
    middle = model.layers[len(model.layers) // 2]
    key = model_key(
        middle, model.dtype, chosen.quantization, chosen.activations, chosen.row_invariant,
        measured_lengths(max_model_len),
    )  # fmt: skip
    return PlanStore.open(config.kernel_plan, config.cache_dir, key)
