"""`load_model`: a `ModelConfig` in, a ready model + tokenizer out.

Steps: resolve the source; convert a GGUF to its cached HF folder (once);
parse config.json; check the files and the tokenizer before allocating
anything (`_prepare`); build the family's model and stream the weights into
it (`_fill`); give its matrices the forms the choices ask, resolve the
execution plan on them without rebinding anything (plan_step.py), then apply
it: the one place layers take their strategies (models/plan_apply.py); note
everything decided, once, for the startup line (`_noted`). "auto" dtype and
quantization are resolved here, from the hardware and from how the weights
came (sluice/loader/choices.py).

Invariant: every way a model can fail to load (bad path, unsupported
architecture, missing or corrupt file, impossible max_model_len) surfaces as a
one-line `ModelLoadError`, which the CLI prints without a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import choices, memory_plan, plan_step
from sluice.loader.block_default import GgufHeader, resolve_quantization
from sluice.loader.gguf_convert import cache_folder_for, converted_folder, source_tensor_types
from sluice.loader.gguf_tensors import gguf_weights
from sluice.loader.hf_blocks import four_bit_bytes, hf_block_weights
from sluice.loader.sources import ModelSource, resolve_source
from sluice.loader.weights import checkpoint_files, iter_weights
from sluice.models import calibration, longrope, mxfp4
from sluice.models.decoder_config import DecoderConfig
from sluice.models.execution_plan import ExecutionPlan
from sluice.models.families.registry import build_model, describe_family, parse_hf_config
from sluice.models.llama import LlamaForCausalLM
from sluice.models.moe_decoder import describe_experts
from sluice.models.native import native_status
from sluice.models.native.qblock import qblock_available
from sluice.models.plan_apply import apply
from sluice.models.quantization import check_quantization
from sluice.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(slots=True)
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    model_config: DecoderConfig
    # Cap on prompt + generated tokens: the user's value, else the model's limit.
    max_model_len: int
    # Display name: "SmolLM2-135M-Instruct" for embedded, else the folder/file name.
    name: str
    # Ids that end generation: the tokenizer's (its eos and every id that
    # generation_config.json and config.json name), the one reading of them.
    eos_token_ids: frozenset[int]
    # The HF folder the weights came from (the cache folder for a GGUF).
    folder: Path
    # What "auto" became (or what was asked): dtype, quantization, and why.
    choices: choices.ModelChoices
    # The execution plan chosen at load, whole in one line
    # (ExecutionPlan.describe: the startup line's and sluice:kernel_plan's
    # text); "" where none applies (another device, batch-invariant mode).
    kernel_plan: str = ""
    # (rows, seconds) of one int8 matmul per step size, from the plan
    # (ExecutionPlan.step_seconds): what speculation's cost rule reads; () if none.
    step_seconds: tuple[tuple[int, float], ...] = ()


def load_model(config: ModelConfig) -> LoadedModel:
    """Load the model `config` names; ModelLoadError (one line) on any failure."""
    start = time.perf_counter()
    # 1. Everything that can be decided and checked without allocating the model.
    ready = _prepare(config)
    # 2. Build the model, fill it, and give its matrices the forms the choices ask.
    model = build_model(ready.model_config, ready.dtype, ready.device, config.batch_invariant)
    _fill(model, ready)
    store = plan_step.open_store(config, model, ready.chosen, ready.max_model_len)
    plan_step.prepare_weights(
        model, ready.chosen, config, ready.files, ready.tokenizer, ready.keep_blocks
    )
    # 3. The execution plan, measured on those weights or read (nothing rebound),
    # then applied: the one place the layers take their strategies.
    blocks = str(ready.quantization) if ready.keep_blocks else ""
    chosen, plan = plan_step.resolve_plan(
        config, model, ready.chosen, store, ready.max_model_len, blocks
    )
    plan = apply(model, plan)
    # 4. What the load decided, noted once for the startup line.
    chosen = _noted(chosen, ready, model, plan, time.perf_counter() - start)
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=ready.tokenizer,
        model_config=ready.model_config,
        max_model_len=ready.max_model_len,
        name=ready.source.name,
        eos_token_ids=ready.tokenizer.eos_token_ids,
        folder=ready.folder,
        choices=chosen,
        kernel_plan=plan.describe(),
        step_seconds=plan.step_seconds,
    )


@dataclass(slots=True)
class _Prepared:
    """What step 1 of a load decided and checked, before any allocation."""

    source: ModelSource
    header: GgufHeader  # a GGUF's header, parsed once if at all
    quantization: str | None  # as resolved: "gguf" and HF_BLOCKS keep blocks
    blocks_reason: str | None  # why the weights stay in blocks, if they do
    folder: Path  # the HF folder (a GGUF's cache folder)
    config_json: dict[str, Any]
    model_config: DecoderConfig
    max_model_len: int
    device: torch.device
    chosen: choices.ModelChoices
    files: list[Path]  # the checkpoint's files; none for a GGUF's blocks
    tokenizer: Tokenizer

    @property
    def keep_blocks(self) -> bool:
        return self.quantization == choices.GGUF_BLOCKS or self.quantization in choices.HF_BLOCKS

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.chosen.dtype)


def _prepare(config: ModelConfig) -> _Prepared:
    """Where the HF folder is (converting a GGUF on first use), then
    everything that can be checked without allocating the model."""
    source = resolve_source(config.model)
    header = GgufHeader(source.path)
    quantization, blocks_reason = resolve_quantization(config.quantization, source, header)
    keep_blocks = quantization == choices.GGUF_BLOCKS or quantization in choices.HF_BLOCKS
    if keep_blocks:
        _check_block_source(source, quantization)
    folder = _hf_folder(source, config, with_weights=quantization != choices.GGUF_BLOCKS)
    config_json = read_config_json(folder)
    model_config = parse_hf_config(config_json)
    max_model_len = resolve_max_model_len(config.max_model_len, model_config)
    # LongRoPE's factor list follows the served context (sluice/models/longrope.py).
    model_config = dataclasses.replace(
        model_config, rope_scaling=longrope.fit_to_context(model_config.rope_scaling, max_model_len)
    )
    device = _device(config.device)
    chosen = choices.choose(
        config.dtype,
        quantization,
        device,
        choices.decoder_weight_bits(source_tensor_types(folder)),
        activations=None if config.batch_invariant else config.activation_quantization,
        kept_experts=mxfp4.kept_format(config_json),
    )
    if not keep_blocks:
        check_quantization(chosen.quantization, device)
    calibration.check_activation_quantization(chosen.activations, device)
    files = [] if quantization == choices.GGUF_BLOCKS else checkpoint_files(folder)
    if device.type == "cpu":
        weights = _weights_estimate(source, files, torch_dtype(chosen.dtype), keep_blocks)
        memory_plan.check_weights_fit(source.name, weights, memory_plan.available_memory_bytes())
    tokenizer = Tokenizer.from_folder(folder)
    _check_vocab(tokenizer, model_config)
    return _Prepared(source, header, quantization, blocks_reason, folder, config_json,
                     model_config, max_model_len, device, chosen, files, tokenizer)  # fmt: skip


def _fill(model: LlamaForCausalLM, ready: _Prepared) -> None:
    """Stream the weights in: a GGUF's blocks, an HF checkpoint quantized to
    blocks tensor by tensor as it streams, or its tensors as they are."""
    if ready.quantization == choices.GGUF_BLOCKS:
        model.load_weights(gguf_weights(ready.header.reader(), ready.config_json))
    elif ready.quantization in choices.HF_BLOCKS:
        model.load_weights(hf_block_weights(iter_weights(ready.files), ready.quantization,
                                            ready.config_json))  # fmt: skip
    else:
        model.load_weights(iter_weights(ready.files))


def _noted(
    chosen: choices.ModelChoices,
    ready: _Prepared,
    model: LlamaForCausalLM,
    plan: ExecutionPlan,
    seconds: float,
) -> choices.ModelChoices:
    """`chosen` with everything else the load decided, for the startup line:
    on a CPU the native kernels and the execution plan whole, then why the
    weights stay in blocks, the family, the experts, LongRoPE and the load."""
    notes: list[str | None] = []
    if ready.device.type == "cpu":
        notes += [native_status().describe(), plan.describe()]
    notes += [
        ready.blocks_reason,
        describe_family(ready.model_config),
        describe_experts(model),
        longrope.describe_longrope(ready.model_config.rope_scaling),
        _describe_load(model, seconds),
    ]
    for note in notes:
        if note:
            chosen = choices.noting(chosen, note)
    return chosen


def _describe_load(model: LlamaForCausalLM, load_s: float) -> str:
    return f"weights {model.weight_bytes() / 2**20:.0f} MiB in memory, loaded in {load_s:.1f} s"


def resolve_max_model_len(requested: int | None, model_config: DecoderConfig) -> int:
    """The user's cap (positive: ModelConfig checks it), or the model's own
    limit; a cap above that limit is refused."""
    limit = model_config.max_position_embeddings
    if requested is None:
        return limit
    if requested > limit:
        raise ModelLoadError(
            f"max_model_len {requested} exceeds the model's max_position_embeddings {limit}"
        )
    return requested


def _weights_estimate(
    source: ModelSource, files: list[Path], dtype: torch.dtype, blocks: bool = False
) -> int:
    """Bytes the weights take once loaded: a GGUF's blocks as the file holds
    them; an HF checkpoint quantized to blocks at load about its 4-bit size;
    a converted GGUF's float32 checkpoint in the model dtype; an HF folder's
    files as they are, MXFP4 experts dequantized (gpt-oss)."""
    if not files:
        return source.path.stat().st_size
    if blocks:
        return four_bit_bytes(files)
    stored = sum(path.stat().st_size for path in files)
    if source.kind == "gguf":  # float32 but for gpt-oss's MXFP4 experts (uint8, kept)
        packed = mxfp4.stored_bytes(files)
        return (stored - packed) * dtype.itemsize // 4 + packed + mxfp4.growth_bytes(files, dtype)
    return stored + mxfp4.growth_bytes(files, dtype)


def _check_block_source(source: ModelSource, quantization: str | None) -> None:
    """`--quantization gguf` needs a GGUF file, q4_k_m and q8_0 an HF
    checkpoint, and each the kernel that reads the blocks."""
    if source.kind == "hf_folder" and quantization == choices.GGUF_BLOCKS:
        raise ModelLoadError("--quantization gguf keeps a GGUF file's blocks; this is an HF folder")
    if source.kind == "gguf" and quantization != choices.GGUF_BLOCKS:
        raise ModelLoadError(
            f"--quantization {quantization} quantizes an HF checkpoint at load; a GGUF file "
            "keeps its own blocks (--quantization gguf)"
        )
    if not qblock_available():
        raise ModelLoadError(
            f"--quantization {quantization} needs the native kernels on an AVX512-VNNI CPU "
            f"({native_status().describe()})"
        )


def _hf_folder(source: ModelSource, config: ModelConfig, with_weights: bool = True) -> Path:
    if source.kind == "hf_folder":
        return source.path
    cache_dir, bound = config.cache_dir, config.cache_max_bytes
    if cache_folder_for(source.path, cache_dir, with_weights).is_dir():
        return converted_folder(source.path, cache_dir, with_weights, bound)
    logger.info("converting %s into %s (once; later loads reuse it)", source.path, cache_dir)
    start = time.perf_counter()
    folder = converted_folder(source.path, cache_dir, with_weights, bound)
    logger.info("converted %s in %.1f s", source.name, time.perf_counter() - start)
    return folder


def read_config_json(folder: Path) -> dict[str, Any]:
    """The model folder's config.json as a dict (the one reader of it)."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"no config.json in {folder}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable config.json in {folder}: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"config.json in {folder} is not a JSON object")
    return value


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a dtype name stands for (the one map of them)."""
    if name not in _DTYPES:
        raise ModelLoadError(f"unsupported dtype {name!r}; choose one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {name!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {name!r} requested but CUDA is not available")
    return device


def _check_vocab(tokenizer: Tokenizer, model_config: DecoderConfig) -> None:
    # A model may pad its embedding beyond the tokenizer, never the reverse.
    if tokenizer.vocab_size > model_config.vocab_size:
        raise ModelLoadError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size "
            f"is {model_config.vocab_size}"
        )
