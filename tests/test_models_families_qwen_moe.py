"""Qwen3-MoE's and Qwen2-MoE's config.json parsers (sluice/models/families/qwen_moe.py): the
expert fields under either name, which layers stay dense, and one line for
what the layer does not run."""

from __future__ import annotations

import pytest

from sluice.errors import ModelLoadError
from sluice.models.families.registry import parse_hf_config
from sluice.models.moe_decoder import parameter_counts

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
    "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
    "hidden_act": "silu", "use_sliding_window": False, "sliding_window": None,
}  # fmt: skip


def test_qwen3_30b_a3b_parses_as_128_experts_top_8_renormalised():
    config = parse_hf_config(QWEN3_30B_A3B)
    assert (config.num_experts, config.num_experts_per_tok) == (128, 8)
    assert config.moe_intermediate_size == 768 and config.norm_topk_prob
    assert config.router_scoring == "softmax_topk" and config.qk_norm
    assert config.dense_mlp_layers == ()
    assert all(config.is_moe_layer(i) for i in range(48))


def test_qwen3_30b_a3b_counts_30_5b_parameters_3_3b_active():
    total, active = parameter_counts(parse_hf_config(QWEN3_30B_A3B))
    assert (round(total / 1e9, 2), round(active / 1e9, 2)) == (30.53, 3.35)


def test_transformers_5_names_the_expert_count_num_local_experts():
    d = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"}
    assert parse_hf_config(d | {"num_local_experts": 16}).num_experts == 16


def test_mlp_only_layers_and_the_sparse_step_keep_dense_layers():
    config = parse_hf_config(
        QWEN3_30B_A3B | {"num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    )
    assert config.dense_mlp_layers == (0, 2, 3, 4)
    assert [config.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts": None}, "num_experts must be positive, got 0"),
        ({"num_experts_per_tok": 129}, "num_experts_per_tok 129 must be between 1 and"),
        ({"moe_intermediate_size": None}, "moe_intermediate_size must be positive"),
        ({"num_experts": "128"}, "'num_experts' must be an integer, got '128'"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step must be positive"),
        ({"shared_expert_intermediate_size": 512}, "unsupported shared experts"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act 'gelu'"),
    ],
)
def test_experts_the_layer_does_not_run_are_one_line(changes, message):
    with pytest.raises(ModelLoadError, match=message):
        parse_hf_config(QWEN3_30B_A3B | changes)


def test_qwen2_moe_biases_q_k_v_and_keeps_a_shared_expert():
    d = QWEN3_30B_A3B | {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
        "shared_expert_intermediate_size": 5632, "norm_topk_prob": False,
    }  # fmt: skip
    config = parse_hf_config(d)
    assert config.shared_expert_intermediate_size == 5632 and not config.norm_topk_prob
    assert config.attention_bias and not config.o_proj_bias and not config.qk_norm
    assert not parse_hf_config(d | {"qkv_bias": False}).attention_bias
