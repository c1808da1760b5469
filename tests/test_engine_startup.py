"""engine/startup.py's rule for a hybrid's state snapshots: prefix caching
stays on only where the snapshot each KV block holds costs no more than the
block's K/V would if every layer attended (`prefix_caching_blocker`), so a
hybrid's block never outweighs a dense model's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers

from sluice.config import CacheConfig, EngineConfig, ModelConfig
from sluice.engine.startup import fit_max_model_len, num_kv_blocks, prefix_caching_blocker
from sluice.loader import memory_plan
from sluice.models.families.registry import parse_hf_config


def _blocker(hf_config: transformers.PretrainedConfig, architecture: str, **cache: Any):
    loaded: Any = SimpleNamespace(
        model_config=parse_hf_config(hf_config.to_dict() | {"architectures": [architecture]})
    )
    return prefix_caching_blocker(EngineConfig(cache=CacheConfig(**cache)), loaded, torch.bfloat16)


def test_the_default_qwen3_5_shape_runs_without_prefix_caching_and_says_which_block_keeps_it():
    """24 DeltaNet layers of 16 key and 32 value heads of 128: a 50.25 MiB
    snapshot against 2 MiB of K/V for a 16-token block of 32 attention
    layers (4 KV heads of 256, bfloat16): 402 tokens a block would keep it."""
    config = transformers.Qwen3_5TextConfig()
    reason = _blocker(config, "Qwen3_5ForCausalLM", block_size_tokens=16)
    assert reason is not None
    assert "a state snapshot in every KV block would cost 50.25 MiB" in reason
    assert "blocks of 402 tokens or more keep it (--block-size)" in reason
    assert _blocker(config, "Qwen3_5ForCausalLM", block_size_tokens=512) is None


def test_lfm2_keeps_prefix_caching_at_the_default_block():
    """LFM2-1.2B's shape: 10 conv layers of 2 x 2048 bfloat16 values (80 KiB)
    against 512 KiB for a 16-token block of 16 attention layers."""
    config = transformers.Lfm2Config(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        layer_types=["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
    )  # fmt: skip
    assert _blocker(config, "Lfm2ForCausalLM") is None


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_nothing_is_blocked_for_a_dense_model_or_with_prefix_caching_off(prefix_caching):
    qwen3_5 = transformers.Qwen3_5TextConfig()
    dense = transformers.Qwen3Config()
    assert _blocker(dense, "Qwen3ForCausalLM", enable_prefix_caching=prefix_caching) is None
    blocked = _blocker(qwen3_5, "Qwen3_5ForCausalLM", enable_prefix_caching=prefix_caching)
    assert (blocked is not None) is prefix_caching


def test_int8_kv_holds_1_6_times_the_tokens_of_bf16_in_the_same_bytes():
    """Heads of 64: a row is 128 bytes in bf16, 64 + four 4-byte scales in int8."""
    hf_config = transformers.LlamaConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    loaded: Any = SimpleNamespace(
        model_config=parse_hf_config(hf_config.to_dict() | {"architectures": ["LlamaForCausalLM"]}),
        max_model_len=16,
    )
    blocks = {
        name: num_kv_blocks(
            EngineConfig(cache=CacheConfig(kv_cache_memory_bytes=64 << 20, kv_cache_dtype=name)),
            loaded,
            torch.bfloat16,
            torch.device("cpu"),
        )  # fmt: skip
        for name in ("auto", "int8")
    }
    assert abs(blocks["int8"] - blocks["auto"] * 128 / 80) < 1


def _loaded_8b() -> Any:
    """Llama-3.1-8B's attention shape, declaring 131,072 tokens (16 GiB of bf16 KV)."""
    hf_config = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072,
    )  # fmt: skip
    return SimpleNamespace(
        model_config=parse_hf_config(hf_config.to_dict() | {"architectures": ["LlamaForCausalLM"]}),
        max_model_len=131072,
    )


@pytest.mark.parametrize(
    "config, fitted",
    [
        (EngineConfig(), True),
        (EngineConfig(model=ModelConfig(max_model_len=131072)), False),  # asked: refused later
        (EngineConfig(cache=CacheConfig(kv_cache_memory_bytes=8 << 30)), False),
    ],
)
def test_an_unasked_context_is_fitted_to_the_machine_and_an_asked_one_never(
    monkeypatch, config, fitted
):
    # The machine's figure, given: 13 GiB available once the weights are in.
    monkeypatch.setattr(memory_plan, "available_memory_bytes", lambda: 13 << 30)
    length = fit_max_model_len(config, _loaded_8b(), torch.bfloat16, torch.device("cpu"))
    assert (length is not None) is fitted
    if length is not None:
        assert 16384 <= length < 131072 and length % 1024 == 0
