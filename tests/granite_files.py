"""Tiny random Granite 4.0-H models (dense, and with experts) built from
transformers' GraniteMoeHybridConfig and saved as HF folders, for the HF
tests (test_models_granite_hybrid.py) and the GGUF ones
(test_models_families_granite_hybrid_gguf.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers

from tests.model_factory import TinyModel

_STD = 0.1
# Mamba-2 layers first, third and fourth; attention (no RoPE) second, as Granite
# 4.0-H interleaves them. 8 heads of 16 in 2 groups, N = 16, kernel 4; every
# Granite scaling away from 1 so that each one is checked.
_CONFIG = {
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "shared_intermediate_size": 96,
    "intermediate_size": 32, "num_experts_per_tok": 2,
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 2,
    "mamba_d_conv": 4, "mamba_expand": 2, "embedding_multiplier": 12.0,
    "residual_multiplier": 0.25, "attention_multiplier": 0.0625, "logits_scaling": 4.0,
    "position_embedding_type": "nope", "tie_word_embeddings": True,
}  # fmt: skip
DENSE, MOE = "dense", "moe"


def build_tiny_granite(kind: str, directory: Path, **changes: Any) -> TinyModel:
    """A random Granite 4.0-H, dense or with 8 experts (top-2), saved as
    safetensors; `changes` replace entries of the config."""
    config_dict = _CONFIG | changes
    layer_types = ["linear_attention" if t == "mamba" else "full_attention"
                   for t in config_dict["layer_types"]]  # fmt: skip
    config = transformers.GraniteMoeHybridConfig(
        **(config_dict | {"layer_types": layer_types, "num_local_experts": 8 if kind == MOE else 0})
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + _STD * torch.randn_like(param))
            elif name.endswith("A_log"):  # decays exp(dt A) spread over (0, 1)
                param.copy_(torch.log(0.5 + 4 * torch.rand_like(param)))
            elif name.endswith("dt_bias"):
                param.normal_(0.0, 0.5)
            elif name.endswith(".D"):
                param.normal_(1.0, 0.3)
            else:
                param.normal_(0.0, _STD)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "config.json").write_text(
        json.dumps(json.loads((directory / "config.json").read_text()) | config_dict)
    )  # Granite's own layer names ("mamba", "attention"), as IBM's config.json has them
    return TinyModel(kind=f"granite_{kind}", path=directory, hf_model=model)
