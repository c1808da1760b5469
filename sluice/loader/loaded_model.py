"""`load_model`: a `ModelConfig` in, a ready model + tokenizer out.

Steps: resolve the source; convert a GGUF to its cached HF folder (once);
parse config.json; check the files and the tokenizer before allocating
anything; build `LlamaForCausalLM`, stream the safetensors tensors into it,
and quantize it if `ModelConfig.quantization` asks. "auto" dtype and
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
from sluice.loader import choices, memory_plan
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
from sluice.models.kernel_plan import KernelPlan, measured_lengths
from sluice.models.kernel_race import int8_candidates, plan_kernels
from sluice.models.linear import RowBands
from sluice.models.llama import LlamaForCausalLM
from sluice.models.moe_decoder import describe_experts
from sluice.models.native import native_status
from sluice.models.native.qblock import qblock_available
from sluice.models.plan_cache import PlanStore, model_key
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
    # 1. Where the HF folder is (converting a GGUF on first use).
    start = time.perf_counter()
    source = resolve_source(config.model)
    header = GgufHeader(source.path)  # a GGUF's header, parsed once if at all
    quantization, blocks_reason = resolve_quantization(config.quantization, source, header)
    keep_blocks = quantization == choices.GGUF_BLOCKS or quantization in choices.HF_BLOCKS
    if keep_blocks:
        _check_block_source(source, quantization)
    folder = _hf_folder(source, config, with_weights=quantization != choices.GGUF_BLOCKS)
    # 2. Everything that can be checked without allocating the model.
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
    dtype = torch_dtype(chosen.dtype)
    if not keep_blocks:
        check_quantization(chosen.quantization, device)
    calibration.check_activation_quantization(chosen.activations, device)
    files = [] if quantization == choices.GGUF_BLOCKS else checkpoint_files(folder)
    if device.type == "cpu":
        weights = _weights_estimate(source, files, dtype, keep_blocks)
        memory_plan.check_weights_fit(source.name, weights, memory_plan.available_memory_bytes())
    tokenizer = Tokenizer.from_folder(folder)
    _check_vocab(tokenizer, model_config)
    # 3. Build and fill the model.
    model = build_model(model_config, dtype, device, config.batch_invariant)
    if quantization == choices.GGUF_BLOCKS:
        model.load_weights(gguf_weights(header.reader(), config_json))
    elif quantization in choices.HF_BLOCKS:  # quantized tensor by tensor as they stream in
        model.load_weights(hf_block_weights(iter_weights(files), quantization, config_json))
    else:
        model.load_weights(iter_weights(files))
    # The execution plan kept for this CPU and model, read once (plan_cache.py).
    middle = model.layers[len(model.layers) // 2]
    store = PlanStore.open(config.kernel_plan, config.cache_dir, model_key(
        middle, dtype, chosen.quantization, chosen.activations, chosen.row_invariant,
        measured_lengths(max_model_len),
    ))  # fmt: skip
    chosen, w8a8_bands = _quantize(model, chosen, config, files, tokenizer, keep_blocks, store)
    plan = ExecutionPlan(None, w8a8_bands, blocks=str(quantization) if keep_blocks else "")
    if device.type == "cpu":
        chosen, plan = _cpu_paths(config, model, max_model_len, chosen, store, plan)
    chosen = _noted(chosen, blocks_reason, model, model_config, time.perf_counter() - start)
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_config=model_config,
        max_model_len=max_model_len,
        name=source.name,
        eos_token_ids=tokenizer.eos_token_ids,
        folder=folder,
        choices=chosen,
        kernel_plan=plan.describe(),
        step_seconds=plan.step_seconds,
    )


def _quantize(
    model: LlamaForCausalLM,
    chosen: choices.ModelChoices,
    config: ModelConfig,
    files: list[Path],
    tokenizer: Tokenizer,
    keep_blocks: bool,
    plan: PlanStore,
) -> tuple[choices.ModelChoices, RowBands | None]:
    """The loaded model's matrices as `chosen` asks: GGUF blocks bound to the
    fused decode layer, a weight-only copy, and int8 activations calibrated
    (the row-invariant scheme, or W8A8 raced against AMX-BF16: `chosen` then
    says which bands it won, kept in `plan`). Returns the choices and the
    bands W8A8 serves where it raced AMX (else None)."""
    if keep_blocks:
        # Layers whose matrices all stayed in blocks decode in one native call each.
        model.bind_fused_decode()
    elif chosen.quantization is not None:
        model.quantize(chosen.quantization)
    if chosen.activations == "int8":
        text = calibration.calibration_text()
        kept = calibration.calibration_file(
            config.cache_dir, files, chosen.dtype, chosen.quantization, text, chosen.row_invariant
        )
        if chosen.row_invariant:
            calibration.quantize_row_invariant(model, tokenizer.encode(text), kept)
        else:
            # With AMX the bfloat16 matmul runs on its tiles: W8A8 races it (int8_threshold.py).
            race = chosen.dtype == "bfloat16" and "amx_bf16" in choices.cpu_flags()
            ids = tokenizer.encode(text)
            bands = calibration.quantize_activations(model, ids, kept, race, plan)
            if race:
                return choices.after_amx_race(chosen, bands), bands
    return chosen, None


def _noted(
    chosen: choices.ModelChoices,
    blocks_reason: str | None,
    model: LlamaForCausalLM,
    model_config: DecoderConfig,
    seconds: float,
) -> choices.ModelChoices:
    """`chosen` with what else the load decided, for the startup line."""
    if blocks_reason:
        chosen = choices.noting(chosen, blocks_reason)
    chosen = choices.noting(chosen, describe_family(model_config))
    if experts := describe_experts(model):
        chosen = choices.noting(chosen, experts)
    if rope_note := longrope.describe_longrope(model_config.rope_scaling):
        chosen = choices.noting(chosen, rope_note)
    chosen = choices.noting(chosen, _describe_load(model, seconds))
    return chosen


def _cpu_paths(
    config: ModelConfig,
    model: LlamaForCausalLM,
    max_model_len: int,
    chosen: choices.ModelChoices,
    store: PlanStore,
    plan: ExecutionPlan,
) -> tuple[choices.ModelChoices, ExecutionPlan]:
    """The native kernels and the execution plan of a CPU model: `plan` with
    the kernel plan (measured or read; kept in `store` where steady) and the
    fused decode layers, noted whole on the startup line."""
    chosen = choices.noting(chosen, native_status().describe())
    kernels = _use_kernel_plan(config, model, max_model_len, store)
    fused = sum(layer.fused_decode is not None for layer in model.layers)
    plan = dataclasses.replace(
        plan, kernels=kernels, fused_decode_layers=(fused, len(model.layers)), not_kept=store.save()
    )
    if described := plan.describe():
        chosen = choices.noting(chosen, described)
    return chosen, plan


def _use_kernel_plan(
    config: ModelConfig, model: LlamaForCausalLM, max_model_len: int, store: PlanStore
) -> KernelPlan | None:
    """Put the kernel plan `config.kernel_plan` gives `model` to use; None in
    batch-invariant mode (which keeps its own attention path)."""
    if config.batch_invariant:
        return None
    plan = plan_kernels(store, model.config, model.dtype, max_model_len, int8_candidates(model))
    model.use_kernel_plan(plan)
    return plan


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
