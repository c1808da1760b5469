"""gpt-oss's config.json parser (sluice/models/families/gpt_oss.py): gpt-oss-20b's
file as OpenAI published it, transformers' defaults, and one line for what
the model does not run."""

from __future__ import annotations

import pytest

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, SLIDING
from sluice.models.families.registry import gguf_family, parse_hf_config
from sluice.models.gpt_oss import GptOssConfig
from sluice.models.moe_decoder import parameter_counts

GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": [SLIDING, FULL] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "rms_norm_eps": 1e-05, "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False,
    }, "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088,
}  # fmt: skip


def test_gpt_oss_20b_parses_as_32_experts_top_4_sliding_128_in_turn_with_yarn():
    config = parse_hf_config(GPT_OSS_20B)
    assert isinstance(config, GptOssConfig)
    assert (config.num_experts, config.num_experts_per_tok) == (32, 4)
    assert config.moe_intermediate_size == 2880 and config.router_scoring == "topk_softmax"
    assert config.layer_types[:3] == (SLIDING, FULL, SLIDING) and config.sliding_window == 128
    assert config.attention_bias and config.o_proj_bias
    assert (config.swiglu_alpha, config.swiglu_limit) == (1.702, 7.0)
    assert config.rope_theta == 150000.0
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "yarn"
    assert config.rope_scaling["factor"] == 32.0 and not config.rope_scaling["truncate"]


def test_gpt_oss_20b_counts_20_9b_parameters_4_2b_active_with_the_embeddings():
    total, active = parameter_counts(parse_hf_config(GPT_OSS_20B))
    # OpenAI's 3.6B active leaves out the 0.58B embedding table; biases and
    # sinks (7M) are not counted.
    assert (round(total / 1e9, 2), round(active / 1e9, 2)) == (20.91, 4.19)


def test_openai_s_mxfp4_quantization_config_is_read():
    config = parse_hf_config(GPT_OSS_20B | {"quantization_config": {
        "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"], "quant_method": "mxfp4",
    }})  # fmt: skip
    assert config.num_experts == 32


def test_transformers_defaults_fill_what_the_file_leaves_out():
    d = {k: v for k, v in GPT_OSS_20B.items()
         if k not in ("layer_types", "rope_theta", "attention_bias", "swiglu_limit")}  # fmt: skip
    config = parse_hf_config(d | {"num_hidden_layers": 3})
    assert config.layer_types == (SLIDING, FULL, SLIDING)
    assert config.rope_theta == 150000.0 and config.attention_bias
    assert config.swiglu_limit == 7.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"quantization_config": {"quant_method": "bitsandbytes"}},
         "unsupported quantization_config (quant_method 'bitsandbytes') for GptOssForCausalLM; "
         "supported: its experts in MXFP4"),
        ({"layer_types": [SLIDING, "chunked_attention"] * 12},
         "unsupported layer_types ['chunked_attention']"),
        ({"layer_types": [SLIDING]}, "layer_types must list one kind for each of the 24 layers"),
        ({"sliding_window": None}, "positive integer sliding_window, got None"),
        ({"swiglu_limit": "7"}, "'swiglu_limit' must be a positive number, got '7'"),
        ({"num_experts_per_tok": 33}, "num_experts_per_tok 33 must be between 1 and"),
        ({"num_local_experts": None}, "config.json lacks 'num_local_experts'"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    ],
)  # fmt: skip
def test_a_config_the_model_does_not_run_is_one_line(changes, message):
    with pytest.raises(ModelLoadError, match=None) as caught:
        parse_hf_config(GPT_OSS_20B | changes)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def _gguf_entries(metadata: dict, num_layers: int = 4) -> dict:
    """The family's GGUF config entries from `metadata` (keys without `gpt-oss.`)."""
    gguf = gguf_family("gpt-oss").gguf
    assert gguf is not None and gguf.config_entries is not None
    config = {"intermediate_size": 2880, "rope_theta": 150000.0, "num_hidden_layers": num_layers,
              "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0}}  # fmt: skip
    return gguf.config_entries(config, lambda key, default=None: metadata.get(key, default))


def test_a_gguf_gets_llama_cpps_fixed_swiglu_untruncated_yarn_and_its_sliding_pattern():
    entries = _gguf_entries({"expert_count": 32, "expert_used_count": 4,
                             "expert_feed_forward_length": 2880, "attention.sliding_window": 128})  # fmt: skip
    assert (entries["num_local_experts"], entries["num_experts_per_tok"]) == (32, 4)
    assert (entries["swiglu_alpha"], entries["swiglu_limit"]) == (1.702, 7.0)
    assert entries["rope_parameters"]["truncate"] is False
    assert "layer_types" not in entries  # transformers' default: sliding, full, ...
    flags = _gguf_entries({"attention.sliding_window_pattern": [True, False, False, True]})
    assert flags["layer_types"] == [SLIDING, FULL, FULL, SLIDING]
    every_third = _gguf_entries({"attention.sliding_window_pattern": 3})
    assert every_third["layer_types"] == [SLIDING, SLIDING, FULL, SLIDING]


@pytest.mark.parametrize(
    "metadata, named",
    [
        ({"expert_feed_forward_length": [2880, 1440, 2880, 2880]}, "per-layer expert widths"),
        ({"rope.freq_base_swa": 10000.0}, "sliding-layer rope base"),
        ({"expert_weights_scale": 2.5}, "expert_weights_scale"),
        ({"attention.sliding_window_pattern": 0}, "sliding_window_pattern"),
    ],
)
def test_gguf_metadata_the_model_does_not_run_is_one_line(metadata, named):
    with pytest.raises(ModelLoadError, match=named) as error:
        _gguf_entries(metadata)
    assert "\n" not in str(error.value)
