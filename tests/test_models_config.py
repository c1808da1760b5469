"""Parsing HF config.json dicts into DecoderConfig, in both transformers layouts."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import UnsupportedRopeScalingError
from sluice.models.families.registry import parse_hf_config
from sluice.models.rope_norm import rope_inv_freq

# Abridged from the published config.json files of real checkpoints.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "vocab_size": 128256,
}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
MISTRAL_7B_V0_3 = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32768,
}
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}


def transformers5_layout(d: dict) -> dict:
    """The same config as transformers 5 writes it: theta inside rope_parameters."""
    d = dict(d)
    scaling = d.pop("rope_scaling", None) or {"rope_type": "default"}
    d["rope_parameters"] = {**scaling, "rope_theta": d.pop("rope_theta")}
    return d


def test_llama_3_2_parses_llama3_rope_scaling():
    config = parse_hf_config(LLAMA_3_2_1B)
    assert config.architecture == "LlamaForCausalLM"
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {
        "rope_type": "llama3",
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    }
    assert config.head_dim == 64 and config.num_query_groups == 4
    assert config.tie_word_embeddings
    assert not config.attention_bias and not config.o_proj_bias


@pytest.mark.parametrize("raw", [LLAMA_3_2_1B, QWEN2_5_0_5B, MISTRAL_7B_V0_3, SMOLLM2_135M])
def test_transformers5_rope_parameters_layout_parses_to_the_same_config(raw):
    assert parse_hf_config(transformers5_layout(raw)) == parse_hf_config(raw)


def test_smollm2_derives_head_dim_and_has_plain_rope():
    config = parse_hf_config(SMOLLM2_135M)
    assert config.head_dim == 64
    assert config.rope_scaling is None
    assert config.rope_theta == 100000.0


def test_qwen2_has_qkv_bias_without_o_bias_and_ignores_its_disabled_window():
    config = parse_hf_config(QWEN2_5_0_5B)
    assert config.attention_bias and not config.o_proj_bias
    assert config.sliding_window is None
    assert config.num_key_value_heads == 2


def test_llama_attention_bias_puts_a_bias_on_all_four_projections():
    config = parse_hf_config(LLAMA_3_2_1B | {"attention_bias": True})
    assert config.attention_bias and config.o_proj_bias


def test_mistral_without_a_window_parses():
    config = parse_hf_config(MISTRAL_7B_V0_3)
    assert config.architecture == "MistralForCausalLM"
    assert config.sliding_window is None
    assert not config.tie_word_embeddings


def test_a_window_as_long_as_the_context_is_accepted_and_ignored():
    config = parse_hf_config(MISTRAL_7B_V0_3 | {"sliding_window": 32768})
    assert config.sliding_window == 32768


def test_a_window_shorter_than_the_context_is_refused():
    with pytest.raises(ModelLoadError, match="sliding window attention is unsupported"):
        parse_hf_config(MISTRAL_7B_V0_3 | {"sliding_window": 4096})


def test_unsupported_architecture_names_itself_and_the_supported_list():
    with pytest.raises(ModelLoadError) as excinfo:
        parse_hf_config(SMOLLM2_135M | {"architectures": ["GPT2LMHeadModel"]})
    message = str(excinfo.value)
    assert "GPT2LMHeadModel" in message and "Qwen2ForCausalLM" in message
    assert "\n" not in message


def test_model_type_stands_in_for_missing_architectures():
    raw = {k: v for k, v in QWEN2_5_0_5B.items() if k != "architectures"}
    assert parse_hf_config(raw).architecture == "Qwen2ForCausalLM"


def test_legacy_type_key_selects_linear_scaling():
    config = parse_hf_config(SMOLLM2_135M | {"rope_scaling": {"type": "linear", "factor": 2.0}})
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_default_rope_type_means_no_scaling():
    config = parse_hf_config(SMOLLM2_135M | {"rope_scaling": {"rope_type": "default"}})
    assert config.rope_scaling is None


def test_dynamic_rope_scaling_is_refused_as_a_value_error():
    raw = SMOLLM2_135M | {"rope_scaling": {"type": "dynamic", "factor": 2.0}}
    with pytest.raises(ValueError, match="'dynamic'"):
        parse_hf_config(raw)


def test_unknown_rope_type_is_refused_naming_the_type():
    raw = transformers5_layout(SMOLLM2_135M | {"rope_scaling": {"rope_type": "mrope", "factor": 4}})
    with pytest.raises(UnsupportedRopeScalingError, match="'mrope'") as excinfo:
        parse_hf_config(raw)
    assert isinstance(excinfo.value, ModelLoadError)


def test_llama3_scaling_without_its_frequency_factors_is_refused():
    raw = SMOLLM2_135M | {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(ModelLoadError, match="low_freq_factor"):
        parse_hf_config(raw)


def test_missing_required_key_is_named():
    raw = {k: v for k, v in SMOLLM2_135M.items() if k != "intermediate_size"}
    with pytest.raises(ModelLoadError, match="intermediate_size"):
        parse_hf_config(raw)


def test_non_silu_activation_is_refused():
    with pytest.raises(ModelLoadError, match="gelu"):
        parse_hf_config(SMOLLM2_135M | {"hidden_act": "gelu"})


def test_query_heads_must_be_a_multiple_of_kv_heads():
    with pytest.raises(ModelLoadError, match="multiple"):
        parse_hf_config(SMOLLM2_135M | {"num_key_value_heads": 2})


def test_missing_kv_heads_means_multi_head_attention():
    raw = {k: v for k, v in SMOLLM2_135M.items() if k != "num_key_value_heads"}
    config = parse_hf_config(raw)
    assert config.num_key_value_heads == 9


def test_config_is_frozen():
    config = parse_hf_config(SMOLLM2_135M)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.vocab_size = 1  # type: ignore[misc]


# Abridged from Qwen/Qwen3-0.6B and google/gemma-3-270m (transformers < 5 layout).
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
GEMMA_3_270M = {
    "_sliding_window_pattern": 6,
    "architectures": ["Gemma3ForCausalLM"],
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "intermediate_size": 2048,
    "layer_types": ["sliding_attention"] * 5
    + ["full_attention"]
    + ["sliding_attention"] * 5
    + ["full_attention"]
    + ["sliding_attention"] * 5
    + ["full_attention"],
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "vocab_size": 262144,
}


def test_qwen3_gets_q_k_norms_its_head_dim_and_no_bias():
    config = parse_hf_config(QWEN3_0_6B)
    assert config.qk_norm and not config.attention_bias and not config.o_proj_bias
    assert (config.head_dim, config.rope_theta, config.tie_word_embeddings) == (128, 1e6, True)
    assert config.attention_scale == 128**-0.5 and config.layer_types == ()


def test_gemma3_keeps_its_window_pattern_local_rope_base_and_tied_head():
    config = parse_hf_config(GEMMA_3_270M)
    assert config.qk_norm and config.tie_word_embeddings
    assert (config.norm_offset, config.embedding_scale) == (1.0, 640**0.5)
    assert config.sliding_window == 512
    assert [i for i, t in enumerate(config.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert (config.rope_theta, config.rope_local_theta) == (1e6, 10000.0)
    assert config.final_logit_softcapping is None and config.hidden_act == "gelu_pytorch_tanh"


def test_gemma3_without_layer_types_takes_one_global_layer_in_six():
    d = {k: v for k, v in GEMMA_3_270M.items() if k != "layer_types"}
    config = parse_hf_config(d | {"sliding_window_pattern": 3, "num_hidden_layers": 6})
    assert config.layer_types == ("sliding_attention", "sliding_attention", "full_attention") * 2


def test_gemma3_with_capped_attention_scores_is_refused():
    with pytest.raises(ModelLoadError, match="attn_logit_softcapping"):
        parse_hf_config(GEMMA_3_270M | {"attn_logit_softcapping": 50.0})


PHI_3_MINI_4K = {
    "architectures": ["Phi3ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "vocab_size": 32064,
}


def test_phi3_mini_4k_attends_within_its_window_on_every_layer():
    config = parse_hf_config(PHI_3_MINI_4K)
    assert config.fused_checkpoint and config.sliding_window == 2047
    assert config.layer_types == ("sliding_attention",) * 32
    assert config.head_dim == 96


# Phi-3.5-mini's shape: LongRoPE from 4096 to 131072 positions (factors abridged).
PHI_3_5_MINI = PHI_3_MINI_4K | {
    "max_position_embeddings": 131072,
    "sliding_window": 262144,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0 + i / 100 for i in range(48)],
        "long_factor": [1.0 + i for i in range(48)],
    },
}


def test_phi3_5_longrope_reads_its_lists_original_length_and_attention_factor():
    scaling = parse_hf_config(PHI_3_5_MINI).rope_scaling
    assert scaling["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == 4096
    assert scaling["attention_factor"] == pytest.approx(
        math.sqrt(1 + math.log(32) / math.log(4096))
    )
    assert scaling["long_factor"][47] == 48.0 and scaling["uses_long_factor"]


def test_longrope_under_its_old_name_su_and_in_the_transformers_5_layout():
    old = PHI_3_5_MINI | {"rope_scaling": PHI_3_5_MINI["rope_scaling"] | {"type": "su"}}
    new = {k: v for k, v in PHI_3_5_MINI.items() if k not in ("rope_scaling", "rope_theta")}
    new["rope_parameters"] = PHI_3_5_MINI["rope_scaling"] | {
        "rope_theta": 10000.0, "original_max_position_embeddings": 4096, "partial_rotary_factor": 1.0,
    }  # fmt: skip
    expected = parse_hf_config(PHI_3_5_MINI)
    assert parse_hf_config(old) == expected == parse_hf_config(new)


def test_longrope_with_a_given_attention_factor_keeps_it():
    scaling = PHI_3_5_MINI["rope_scaling"] | {"attention_factor": 1.25}
    config = parse_hf_config(PHI_3_5_MINI | {"rope_scaling": scaling})
    assert config.rope_scaling["attention_factor"] == 1.25


def test_longrope_without_both_lists_is_refused():
    scaling = {"type": "longrope", "short_factor": [1.0] * 48}
    with pytest.raises(ModelLoadError, match="'long_factor'"):
        parse_hf_config(PHI_3_5_MINI | {"rope_scaling": scaling})


# Phi-4-mini-instruct's shape: 24 heads of 128 dims, RoPE on the first 96.
PHI_4_MINI = PHI_3_5_MINI | {
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "partial_rotary_factor": 0.75,
    "tie_word_embeddings": True,
    "vocab_size": 200064,
}


def test_phi4_mini_rotates_96_of_128_dims_at_top_level_and_in_rope_parameters():
    config = parse_hf_config(PHI_4_MINI)
    assert (config.head_dim, config.rotary_dim, config.has_partial_rotary) == (128, 96, True)
    assert rope_inv_freq(config).shape == (48,)  # one per LongRoPE factor
    new = {k: v for k, v in PHI_4_MINI.items()
           if k not in ("rope_scaling", "rope_theta", "partial_rotary_factor")}  # fmt: skip
    new["rope_parameters"] = PHI_4_MINI["rope_scaling"] | {
        "rope_theta": 10000.0, "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
    }  # fmt: skip
    assert parse_hf_config(new) == config
    assert not parse_hf_config(PHI_3_5_MINI).has_partial_rotary


def test_partial_rotary_outside_phi3_is_refused():
    llama = PHI_3_MINI_4K | {"architectures": ["LlamaForCausalLM"], "partial_rotary_factor": 0.5}
    with pytest.raises(ModelLoadError, match="partial_rotary_factor 0.5 for LlamaForCausalLM"):
        parse_hf_config(llama)
