"""The model class each supported architecture runs in.

Every family is a `LlamaForCausalLM` (the engine's one model interface);
Gemma 3 and Gemma 2 are the subclass with their norms and embedding.
"""

from __future__ import annotations

import torch

from sluice.models.config import SLIDING, LlamaConfig
from sluice.models.gemma3 import Gemma3ForCausalLM
from sluice.models.llama import LlamaForCausalLM


def build_model(
    config: LlamaConfig, dtype: torch.dtype, device: torch.device | str, batch_invariant: bool
) -> LlamaForCausalLM:
    """An unloaded model of `config`'s family (weights come from `load_weights`)."""
    model_class = Gemma3ForCausalLM if config.is_gemma else LlamaForCausalLM
    return model_class(config, dtype, device, batch_invariant)


def describe_family(config: LlamaConfig) -> str:
    """The architecture, and which engine paths it cannot use, for the startup line."""
    limits = []
    if config.attn_logit_softcapping is not None:
        limits.append(
            "attention soft-capping runs every layer's attention on the torch path, not the "
            "native attention kernels; its sliding-window layers keep all their KV blocks"
        )
    elif SLIDING in config.layer_types:
        limits.append(
            f"its sliding-window layers (window {config.sliding_window}) attend on the torch "
            "path, not the native attention kernels, and keep all their KV blocks"
        )
    if config.has_partial_rotary:
        limits.append(
            f"partial rotary (RoPE on {config.rotary_dim} of {config.head_dim} dims per head) "
            "rotates q and k on the torch path, not the native RoPE + K/V-write kernel"
        )
    return f"architecture {config.architecture}: {'; '.join(limits) or 'every engine path'}"
