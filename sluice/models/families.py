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
    if config.attn_logit_softcapping is not None:
        return (
            f"architecture {config.architecture}: attention soft-capping runs every layer's "
            "attention on the torch path, not the native attention kernels; its sliding-window "
            "layers keep all their KV blocks"
        )
    if SLIDING in config.layer_types:
        return (
            f"architecture {config.architecture}: its sliding-window layers (window "
            f"{config.sliding_window}) attend on the torch path, not the native attention "
            "kernels, and keep all their KV blocks"
        )
    return f"architecture {config.architecture}: every engine path"
