"""Gemma 4's text decoder (sluice/models/gemma4.py, families/gemma4.py)
against transformers 5.24's `Gemma4ForCausalLM` on a tiny random model
(tests/model_factory.py `gemma4`): sliding (window 8) and full layers with
their own head sizes and RoPE, V from k_proj on the full layers, the last
two layers sharing earlier layers' K/V with a double-wide MLP, per-layer
embeddings, random layer scalars and a logit cap.

Tolerance as test_models_llama.py: float32 logits within 1e-4 of the logit
scale. The engine's paths (chunked prefill, prefix cache, preemption,
speculation) are in test_models_families.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

from sluice.errors import ModelLoadError
from sluice.models.attention import allocate_kv_caches, kv_cache_bytes_per_block
from sluice.models.decoder_config import FULL, SLIDING
from sluice.models.families.registry import build_model, parse_hf_config
from sluice.models.gemma4 import Gemma4ForCausalLM
from tests.model_factory import GEMMA4_KIND, GEMMA4_MULTIMODAL_KIND, TinyModel, build_tiny_model
from tests.model_runs import (
    PagedRunner,
    assert_close_to_scale,
    greedy,
    hf_logits,
    prompt_logits,
)

PROMPT = [(7 * i + 3) % 509 + 3 for i in range(30)]
BASE = {
    "architectures": ["Gemma4ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
    "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 64,
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_model(GEMMA4_KIND, tmp_path_factory.mktemp(GEMMA4_KIND))


def load(tiny: TinyModel, dtype=torch.float32, batch_invariant=False) -> Gemma4ForCausalLM:
    model = build_model(parse_hf_config(tiny.config_dict), dtype, "cpu", batch_invariant)
    model.load_weights(tiny.weights())
    assert isinstance(model, Gemma4ForCausalLM)
    return model


def test_prompt_logits_match_transformers_at_every_position(tiny):
    assert len(PROMPT) > 3 * 8  # past the window, so the sliding layers slide
    assert_close_to_scale(prompt_logits(load(tiny), PROMPT), hf_logits(tiny, PROMPT), 1e-4)


def test_greedy_decode_over_the_paged_cache_matches_transformers_generate(tiny):
    ours = greedy(PagedRunner(load(tiny)), PROMPT[:12], 24)
    with torch.no_grad():
        generated = tiny.hf_model.generate(
            torch.tensor([PROMPT[:12]]), do_sample=False, max_new_tokens=24, eos_token_id=None,
            pad_token_id=0,
        )  # fmt: skip
    assert ours == generated[0, 12:].tolist()


def test_a_chunk_after_cached_context_matches_transformers(tiny):
    runner = PagedRunner(load(tiny))
    table: list[int] = []
    runner.step([PROMPT[:17]], [0], [table])
    logits = runner.step([PROMPT[17:]], [17], [table])
    assert_close_to_scale(logits, hf_logits(tiny, PROMPT)[-1:], 1e-4)


def test_bfloat16_stays_as_near_float32_as_transformers_bfloat16_does(tiny):
    """This tiny model amplifies rounding (its layer scalars and per-layer
    inputs compound): transformers' own bfloat16 run is about 0.2 of the
    logit scale off its float32 one; ours must be no further."""
    reference = hf_logits(tiny, PROMPT)
    hf_bf16 = copy.deepcopy(tiny.hf_model).to(torch.bfloat16)
    with torch.no_grad():
        hf_error = (hf_bf16(torch.tensor([PROMPT])).logits[0].float() - reference).abs().max()
    ours = prompt_logits(load(tiny, torch.bfloat16), PROMPT)
    assert (ours - reference).abs().max() <= 1.5 * hf_error


def test_batch_invariant_mode_matches_transformers(tiny):
    logits = prompt_logits(load(tiny, batch_invariant=True), PROMPT)
    assert_close_to_scale(logits, hf_logits(tiny, PROMPT), 1e-4)


def test_shared_layers_read_their_sources_cache_and_cost_no_blocks(tiny):
    config = parse_hf_config(tiny.config_dict)
    assert [config.kv_source_layer(i) for i in range(5)] == [0, 1, 2, 2, 1]
    caches = allocate_kv_caches(config, 4, 2, torch.float32, "cpu")
    assert caches[3] is caches[2] and caches[4] is caches[1]
    assert caches[0].shape == (2, 4, 2, 2, 16) and caches[1].shape == (2, 4, 2, 1, 32)
    # Layers 0 and 2 (2 KV heads of 16), layer 1 (1 of 32): K and V, 2 tokens, 4 bytes.
    assert kv_cache_bytes_per_block(config, 2, torch.float32) == (2 * 32 + 32) * 2 * 2 * 4


def test_a_multimodal_checkpoint_runs_as_its_text_decoder(tmp_path):
    """Gemma4ForConditionalGeneration: text_config parsed, the weights under
    model.language_model loaded, the vision tower's skipped; text logits as
    transformers' multimodal model gives them."""
    tiny = build_tiny_model(GEMMA4_MULTIMODAL_KIND, tmp_path)
    assert any(name.startswith("model.vision_tower.") for name, _ in tiny.weights())
    config = parse_hf_config(tiny.config_dict)
    assert config.architecture == "Gemma4ForConditionalGeneration"
    model = build_model(config, torch.float32, "cpu", False)
    model.load_weights(tiny.weights())
    assert_close_to_scale(prompt_logits(model, PROMPT), hf_logits(tiny, PROMPT), 1e-4)


def test_a_multimodal_config_reads_its_text_fields_from_text_config_or_the_top_level():
    nested = {"architectures": ["Gemma4ForConditionalGeneration"], "text_config": BASE}
    flat = BASE | {"architectures": ["Gemma4ForConditionalGeneration"]}
    assert parse_hf_config(nested) == parse_hf_config(flat)
    assert parse_hf_config(nested).full_head_dim == 512
    with pytest.raises(ModelLoadError, match="text_config must be an object"):
        parse_hf_config(nested | {"text_config": "gemma"})


def test_full_layers_take_their_heads_from_per_layer_config_or_global_head_dim():
    saved = parse_hf_config(BASE | {"per_layer_config": {"5": {"head_dim": 16}}})
    assert (saved.full_head_dim, saved.full_num_key_value_heads) == (16, None)
    assert saved.layer_types == (SLIDING,) * 5 + (FULL,)
    given = parse_hf_config(
        BASE | {"global_head_dim": 24, "num_global_key_value_heads": 1, "attention_k_eq_v": True}
    )
    assert (given.full_head_dim, given.full_num_key_value_heads) == (24, 1)
    assert given.layer_kv_shape(5) == (1, 24) and given.layer_kv_shape(0) == (2, 8)
    assert parse_hf_config(BASE).full_head_dim == 512  # transformers' default


def test_the_full_layers_rope_is_proportional_and_the_sliding_layers_use_their_base():
    config = parse_hf_config(BASE)
    assert config.rope_scaling == {
        "rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": 1.0,
    }  # fmt: skip
    assert (config.rope_theta, config.rope_local_theta) == (1e6, 1e4)
    assert config.attention_scale == 1.0 and config.norm_offset == 0.0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"enable_moe_block": True}, "enable_moe_block"),
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
        ({"hidden_activation": "silu"}, "'silu'"),
        ({"per_layer_config": {"1": {"head_dim": 16}}}, "per_layer_config"),
        ({"per_layer_config": {"5": {"sliding_window": 4}}}, "per_layer_config"),
        ({"num_kv_shared_layers": 6}, "num_kv_shared_layers 6"),
        (
            {"layer_types": [SLIDING] * 5 + [FULL], "num_kv_shared_layers": 1},
            "num_kv_shared_layers 1",
        ),
        ({"layer_types": [SLIDING, "chunked_attention"] * 3}, "layer_types"),
        ({"rope_parameters": {SLIDING: {"rope_type": "yarn"}, FULL: {}}}, "'yarn'"),
        ({"rope_parameters": {SLIDING: {}, FULL: {"rope_type": "llama3"}}}, "'llama3'"),
    ],
)
def test_what_it_cannot_run_is_one_line_naming_it(change, named):
    with pytest.raises(ModelLoadError, match=named) as raised:
        parse_hf_config(BASE | change)
    assert "\n" not in str(raised.value)
