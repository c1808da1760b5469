"""Every family the engine runs, by HF architecture and by GGUF architecture.

The one place that maps a model's name to its `Family`: `parse_hf_config`
reads config.json with the family's parser, `build_model` makes its model
class, `gguf_family` names its llama.cpp layout, `describe_family` says which
engine paths it cannot take. A name no family claims is one `ModelLoadError`
line naming it and every supported one.
"""

from __future__ import annotations

from typing import Any

import torch

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import CONV, LINEAR, MAMBA, SLIDING, DecoderConfig
from sluice.models.families import (
    gemma,
    gemma4,
    gpt_oss,
    granite_hybrid,
    lfm2,
    llama,
    phi3,
    qwen,
    qwen3_5,
    qwen_moe,
    smollm3,
)
from sluice.models.families.family import Family
from sluice.models.families.hf_fields import check_heads
from sluice.models.gpt_oss import GptOssConfig
from sluice.models.llama import LlamaForCausalLM

FAMILIES: tuple[Family, ...] = (
    *llama.FAMILIES, *qwen.FAMILIES, *phi3.FAMILIES, *gemma.FAMILIES, *smollm3.FAMILIES,
    *gemma4.FAMILIES,
    *lfm2.FAMILIES,
    *qwen3_5.FAMILIES,
    *qwen_moe.FAMILIES,
    *gpt_oss.FAMILIES,
    *granite_hybrid.FAMILIES,
)  # fmt: skip
_BY_ARCHITECTURE = {family.architecture: family for family in FAMILIES}
_BY_MODEL_TYPE = {family.model_type: family for family in FAMILIES}
_BY_GGUF = {family.gguf.architecture: family for family in FAMILIES if family.gguf is not None}
SUPPORTED_ARCHITECTURES = tuple(_BY_ARCHITECTURE)
SUPPORTED_GGUF_ARCHITECTURES = tuple(_BY_GGUF)


def parse_hf_config(d: dict[str, Any]) -> DecoderConfig:
    """An HF config.json dict -> its family's `DecoderConfig`; ModelLoadError
    (one line) on an architecture no family runs or a config it cannot run."""
    return check_heads(_family_of_hf_config(d).parse_config(d))


def family_of(config: DecoderConfig) -> Family:
    """The family a parsed config came from."""
    return _BY_ARCHITECTURE[config.architecture]


def gguf_family(gguf_architecture: Any) -> Family:
    """The family a GGUF's `general.architecture` names."""
    family = _BY_GGUF.get(gguf_architecture)
    if family is None:
        raise ModelLoadError(
            f"unsupported GGUF architecture {gguf_architecture!r}; "
            f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    return family


def build_model(
    config: DecoderConfig, dtype: torch.dtype, device: torch.device | str, batch_invariant: bool
) -> LlamaForCausalLM:
    """An unloaded model of `config`'s family (weights come from `load_weights`)."""
    return family_of(config).model_class(config, dtype, device, batch_invariant)


def describe_family(config: DecoderConfig) -> str:
    """The architecture, and which engine paths it cannot use, for the startup line."""
    limits = []
    if isinstance(config, GptOssConfig):  # its sinks: no native attention kernel adds them
        limits.append(
            "attention sinks run every layer's attention on the torch path, not the native "
            f"attention kernels; its sliding-window layers (window {config.sliding_window}) keep "
            "all their KV blocks"
        )
    elif config.attn_logit_softcapping is not None:
        limits.append(
            "attention soft-capping runs every layer's attention on the torch path, not the "
            "native attention kernels; its sliding-window layers keep all their KV blocks"
        )
    elif SLIDING in config.layer_types:
        limits.append(
            f"its sliding-window layers (window {config.sliding_window}) attend on the torch "
            "path, not the native attention kernels, and keep all their KV blocks"
        )
    if LINEAR in config.layer_types:
        limits.append(
            f"{config.layer_types.count(LINEAR)} of its {config.num_hidden_layers} layers are "
            "Gated DeltaNet linear attention over a per-sequence float32 state (no KV; a state "
            "snapshot per KV block for the prefix cache), token by token on the torch path"
        )
    if MAMBA in config.layer_types:
        limits.append(
            f"{config.layer_types.count(MAMBA)} of its {config.num_hidden_layers} layers are "
            "Mamba-2 mixers over a per-sequence float32 state (no KV; a state snapshot per KV "
            "block for the prefix cache), token by token on the torch path"
        )
    if CONV in config.layer_types:
        num_conv = config.layer_types.count(CONV)
        limits.append(
            f"{num_conv} of its {config.num_hidden_layers} layers are short convolutions over a "
            "per-sequence state (no KV; a state snapshot per KV block for the prefix cache), "
            "on the torch path"
        )
    if config.full_head_dim is not None:  # Gemma 4
        limits.append("q and k rotate on the torch path, not the native RoPE + K/V-write kernel")
    if config.num_kv_shared_layers:
        limits.append(
            f"its last {config.num_kv_shared_layers} layers attend over earlier layers' K/V "
            "and hold none of their own"
        )
    if config.has_partial_rotary:
        limits.append(
            f"partial rotary (RoPE on {config.rotary_dim} of {config.head_dim} dims per head) "
            "rotates q and k on the torch path, not the native RoPE + K/V-write kernel"
        )
    if config.num_experts:
        limits.append(
            "its MoE layers run the experts grouped by expert (moe.py: in the model dtype on "
            "tiles of 8 rows, or kept in the file's GGUF or MXFP4 blocks on their kernels), not "
            "the fused native decode call nor int8 weights"
        )
    return f"architecture {config.architecture}: {'; '.join(limits) or 'every engine path'}"


def _family_of_hf_config(d: dict[str, Any]) -> Family:
    names = d.get("architectures") or []
    if not names and d.get("model_type") in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[d["model_type"]]
    for name in names:
        if name in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[name]
    shown = ", ".join(names) or f"model_type {d.get('model_type')!r}"
    raise ModelLoadError(
        f"unsupported architecture {shown}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )
