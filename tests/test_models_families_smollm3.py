"""SmolLM3 (sluice/models/families/smollm3.py): which layers rotate, as
transformers' `SmolLM3Config` derives them, and that the unrotated layers
are what the parity with transformers rests on. Logits and greedy decode
against transformers: test_models_llama.py (`smollm3`); the engine's
paths: test_models_families.py."""

from __future__ import annotations

import pytest
import torch

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, SLIDING
from sluice.models.families.registry import parse_hf_config
from tests.model_factory import SMOLLM3_KIND, build_tiny_model, load_tiny_llama, tiny_hf_config
from tests.model_runs import BLOCK_SIZE, PagedRunner, hf_logits, prompt_logits

BASE = {
    "architectures": ["SmolLM3ForCausalLM"], "vocab_size": 8, "hidden_size": 32,
    "intermediate_size": 8, "num_hidden_layers": 8, "num_attention_heads": 2,
    "max_position_embeddings": 4096,
}  # fmt: skip
PROMPT = [(11 * i + 5) % 509 + 3 for i in range(30)]


def test_every_fourth_layer_is_nope_by_default_as_transformers_derives_it():
    config = parse_hf_config(BASE)
    hf = type(tiny_hf_config(SMOLLM3_KIND))(
        **{k: v for k, v in BASE.items() if k != "architectures"}
    )
    assert config.nope_layers == (3, 7)
    assert config.nope_layers == tuple(i for i, rope in enumerate(hf.no_rope_layers) if not rope)


def test_smollm3_defaults_tie_the_head_and_use_its_rope_base():
    config = parse_hf_config(BASE)
    assert config.tie_word_embeddings and config.rope_theta == 2_000_000.0
    assert parse_hf_config(BASE | {"rope_theta": 5e6}).rope_theta == 5e6


def test_no_rope_layers_and_the_interval_choose_the_nope_layers():
    assert parse_hf_config(BASE | {"no_rope_layer_interval": 2}).nope_layers == (1, 3, 5, 7)
    flags = [1, 0, 1, 1, 1, 1, 0, 1, 1]  # longer than the layers, as transformers allows
    assert parse_hf_config(BASE | {"no_rope_layers": flags}).nope_layers == (1, 6)


def test_a_bad_layer_layout_is_one_line_naming_it():
    with pytest.raises(ModelLoadError, match="no_rope_layers must hold 1"):
        parse_hf_config(BASE | {"no_rope_layers": [1, 0]})
    with pytest.raises(ModelLoadError, match="no_rope_layer_interval"):
        parse_hf_config(BASE | {"no_rope_layer_interval": 0})
    with pytest.raises(ModelLoadError, match="layer_types must name"):
        parse_hf_config(BASE | {"layer_types": ["chunked_attention"] * 8})
    with pytest.raises(ModelLoadError, match="use_sliding_window is off"):
        parse_hf_config(BASE | {"layer_types": [SLIDING] * 8, "sliding_window": 16})


def test_with_a_window_the_nope_layers_slide():
    config = parse_hf_config(BASE | {"use_sliding_window": True, "sliding_window": 16})
    assert config.sliding_window == 16
    assert [i for i, kind in enumerate(config.layer_types) if kind == SLIDING] == [3, 7]
    assert config.layer_types[0] == FULL


def test_rotating_the_nope_layer_breaks_the_parity(tmp_path):
    tiny = build_tiny_model(SMOLLM3_KIND, tmp_path)
    reference = hf_logits(tiny, PROMPT)
    ours = prompt_logits(load_tiny_llama(tiny), PROMPT)
    rotated = prompt_logits(load_tiny_llama(tiny, nope_layers=()), PROMPT)
    scale = reference.abs().max()
    assert (ours - reference).abs().max() <= 1e-4 * scale
    assert (rotated - reference).abs().max() > 1e-2 * scale


def test_a_nope_layer_caches_its_keys_unrotated_bit_for_bit(tmp_path):
    """Angle 0 on the native RoPE + K/V-write kernel (bfloat16): the NoPE
    layer's K in the cache is k_proj's output exactly, at every position."""
    tiny = build_tiny_model(SMOLLM3_KIND, tmp_path)
    model = load_tiny_llama(tiny, torch.bfloat16)
    runner = PagedRunner(model)
    seen: list[torch.Tensor] = []
    nope = model.layers[3]
    nope.register_forward_pre_hook(lambda _, args: seen.append(args[0].clone()))
    runner.step([PROMPT[:BLOCK_SIZE]], [0], [[1]])  # one block: block 1, slots 0-3
    with torch.inference_mode():
        qkv = nope.qkv_proj(nope.attention_norm(seen[0]))  # [T, (Hq + 2 Hkv) D]
    q_rows, kv_rows = nope.num_heads * nope.head_dim, nope.num_kv_heads * nope.head_dim
    keys = qkv[:, q_rows : q_rows + kv_rows].view(BLOCK_SIZE, nope.num_kv_heads, nope.head_dim)
    assert torch.equal(runner.kv_caches[3][0, 1, :BLOCK_SIZE], keys)


def test_with_a_window_on_its_nope_layer_the_logits_still_match_transformers(tmp_path):
    """use_sliding_window: the NoPE layer (3) attends within 8 positions, as
    transformers' SmolLM3 does; a 30-token prompt runs past the window."""
    tiny = build_tiny_model(
        SMOLLM3_KIND, tmp_path, use_sliding_window=True, sliding_window=8,
        layer_types=[FULL, FULL, FULL, SLIDING],
    )  # fmt: skip
    model = load_tiny_llama(tiny)
    assert model.config.layer_types[3] == SLIDING and model.layers[3].is_sliding
    reference = hf_logits(tiny, PROMPT)
    assert (prompt_logits(model, PROMPT) - reference).abs().max() <= 1e-4 * reference.abs().max()
    unwindowed = load_tiny_llama(tiny, layer_types=(FULL,) * 4)
    assert (
        prompt_logits(unwindowed, PROMPT) - reference
    ).abs().max() > 1e-2 * reference.abs().max()
