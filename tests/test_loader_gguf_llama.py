"""GGUF metadata and tensors in HF terms: config, names, shapes, q/k un-permutation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from sluice.errors import ModelLoadError
from sluice.loader import gguf_llama
from sluice.loader.sources import embedded_gguf_path
from sluice.models.families.registry import gguf_family


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows (LlamaModel.permute)."""
    half = weights.shape[0] // num_heads // 2
    return (
        weights.reshape(num_heads, 2, half, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf(path: Path, arch: str, metadata: dict, tensors: dict[str, np.ndarray]) -> GGUFReader:
    """A minimal GGUF: llama-like metadata plus the given F32 tensors."""
    writer = GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        if isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFReader(path)


LLAMA_METADATA = {
    "block_count": 1,
    "context_length": 128,
    "embedding_length": 8,
    "feed_forward_length": 16,
    "attention.head_count": 2,
    "attention.head_count_kv": 1,
    "vocab_size": 32,
}


@pytest.fixture(scope="module")
def embedded_reader() -> GGUFReader:
    return GGUFReader(embedded_gguf_path())


def test_embedded_config_matches_smollm2_135m(embedded_reader):
    config = gguf_llama.hf_config(embedded_reader)
    expected = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    assert {key: config[key] for key in expected} == expected
    assert config["rms_norm_eps"] == pytest.approx(1e-5)


def test_unpermute_inverts_llama_cpp_permute_for_query_and_grouped_key_heads():
    rng = np.random.default_rng(0)
    for num_heads, shape in [(9, (576, 16)), (3, (192, 16)), (4, (32,))]:
        original = rng.standard_normal(shape).astype(np.float32)
        restored = gguf_llama.unpermute_rope_rows(llama_cpp_permute(original, num_heads), num_heads)
        np.testing.assert_array_equal(restored, original)


def test_unpermute_splits_interleaved_rotary_pairs_into_halves():
    # One head of dim 4 stored by llama.cpp as rows (x0, x2, x1, x3).
    stored = np.array([0, 2, 1, 3], dtype=np.float32)
    np.testing.assert_array_equal(gguf_llama.unpermute_rope_rows(stored, 1), [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("gguf_name", "hf_name"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"),
        ("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"),
        ("blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"),
        ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"),
        ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
    ],
)
def test_gguf_tensor_names_map_to_hf_llama_names(gguf_name, hf_name):
    assert gguf_llama.hf_tensor_name(gguf_name) == hf_name


def test_an_unknown_tensor_name_is_refused():
    with pytest.raises(ModelLoadError, match="unsupported GGUF tensor 'blk.0.ssm_conv1d.weight'"):
        gguf_llama.hf_tensor_name("blk.0.ssm_conv1d.weight")


def test_tensors_come_out_in_hf_shape_with_q_unpermuted(tmp_path):
    q_proj = np.arange(8 * 8, dtype=np.float32).reshape(8, 8)  # [out, in]
    down = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)  # [hidden, intermediate]
    tensors = {
        "blk.0.attn_q.weight": llama_cpp_permute(q_proj, 2),
        "blk.0.ffn_down.weight": down,
    }
    reader = write_gguf(tmp_path / "t.gguf", "llama", LLAMA_METADATA, tensors)
    config = {"num_attention_heads": 2, "num_key_value_heads": 1}
    out = dict(gguf_llama.hf_tensors(reader, config))
    np.testing.assert_array_equal(out["model.layers.0.self_attn.q_proj.weight"], q_proj)
    np.testing.assert_array_equal(out["model.layers.0.mlp.down_proj.weight"], down)


def test_quantized_tensors_are_dequantized_to_float32(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.standard_normal((4, 64)).astype(np.float32)
    writer = GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    blocks = quantize(values, GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.ffn_up.weight", blocks, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (name, weights), *_ = gguf_llama.hf_tensors(GGUFReader(tmp_path / "q.gguf"), {})
    assert name == "model.layers.0.mlp.up_proj.weight"
    assert weights.dtype == np.float32 and weights.shape == (4, 64)
    np.testing.assert_allclose(weights, values, atol=0.02)


def test_a_non_llama_architecture_is_refused(tmp_path):
    reader = write_gguf(tmp_path / "g.gguf", "gpt2", {"block_count": 1}, {})
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'gpt2'"):
        gguf_llama.hf_config(reader)


def test_an_unknown_rope_scaling_is_refused(tmp_path):
    metadata = {**LLAMA_METADATA, "rope.scaling.type": "ntk"}
    reader = write_gguf(tmp_path / "r.gguf", "llama", metadata, {})
    with pytest.raises(ModelLoadError, match="unsupported GGUF rope scaling 'ntk'"):
        gguf_llama.hf_config(reader)


def test_yarn_scaling_without_its_factor_or_original_context_is_refused(tmp_path):
    metadata = {**LLAMA_METADATA, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}
    reader = write_gguf(tmp_path / "r.gguf", "llama", metadata, {})
    with pytest.raises(ModelLoadError, match="yarn rope scaling needs llama.rope.scaling.factor"):
        gguf_llama.hf_config(reader)


def test_yarn_scaling_becomes_the_configs_yarn_entries(tmp_path):
    metadata = {
        **LLAMA_METADATA, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 32, "rope.scaling.yarn_beta_fast": 16.0,
    }  # fmt: skip
    config = gguf_llama.hf_config(write_gguf(tmp_path / "r.gguf", "llama", metadata, {}))
    assert config["rope_parameters"] == {
        "rope_type": "yarn", "rope_theta": config["rope_theta"], "factor": 4.0,
        "original_max_position_embeddings": 32, "beta_fast": 16.0,
    }  # fmt: skip


def test_rope_frequency_factors_become_the_configs_freq_factors(tmp_path):
    factors = np.array([1.0, 8.0], dtype=np.float32)  # head_dim 4: two frequencies
    reader = write_gguf(
        tmp_path / "f.gguf", "llama", LLAMA_METADATA, {"rope_freqs.weight": factors}
    )
    config = gguf_llama.hf_config(reader)
    assert config["rope_parameters"]["rope_type"] == "freq_factors"
    assert config["rope_parameters"]["factors"] == [1.0, 8.0]
    assert list(gguf_llama.hf_tensors(reader, config)) == []  # not a model tensor


def test_rope_frequency_factors_with_another_scaling_are_refused(tmp_path):
    metadata = {**LLAMA_METADATA, "rope.scaling.type": "linear"}
    tensors = {"rope_freqs.weight": np.ones(2, dtype=np.float32)}
    reader = write_gguf(tmp_path / "f.gguf", "llama", metadata, tensors)
    with pytest.raises(ModelLoadError, match="rope_freqs with rope scaling 'linear'"):
        gguf_llama.hf_config(reader)


def test_untied_head_and_q_bias_show_in_the_config(tmp_path):
    tensors = {
        "output.weight": np.zeros((32, 8), dtype=np.float32),
        "blk.0.attn_q.bias": np.zeros(8, dtype=np.float32),
    }
    reader = write_gguf(tmp_path / "b.gguf", "llama", LLAMA_METADATA, tensors)
    config = gguf_llama.hf_config(reader)
    assert config["tie_word_embeddings"] is False
    assert config["attention_bias"] is True
    assert config["head_dim"] == 4


@pytest.mark.parametrize(
    ("arch", "gguf_name", "hf_name"),
    [
        ("qwen3", "blk.2.attn_q_norm.weight", "model.layers.2.self_attn.q_norm.weight"),
        ("qwen3", "blk.2.ffn_norm.weight", "model.layers.2.post_attention_layernorm.weight"),
        ("gemma3", "blk.1.attn_k_norm.weight", "model.layers.1.self_attn.k_norm.weight"),
        ("gemma3", "blk.1.post_attention_norm.weight",
         "model.layers.1.post_attention_layernorm.weight"),
        ("gemma3", "blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"),
        ("gemma3", "blk.1.post_ffw_norm.weight",
         "model.layers.1.post_feedforward_layernorm.weight"),
    ],
)  # fmt: skip
def test_each_family_maps_llama_cpps_names_onto_its_hf_modules(arch, gguf_name, hf_name):
    assert gguf_llama.hf_tensor_name(gguf_name, gguf_family(arch).gguf) == hf_name


def test_a_llama_gguf_has_no_post_norms():
    with pytest.raises(ModelLoadError, match="not part of a llama model"):
        gguf_llama.hf_tensor_name("blk.0.post_ffw_norm.weight")


GEMMA3_METADATA = LLAMA_METADATA | {
    "block_count": 12, "attention.key_length": 16, "attention.sliding_window": 512,
}  # fmt: skip


def test_gemma3_metadata_becomes_hf_gemma3_with_llama_cpps_fixed_choices(tmp_path):
    reader = write_gguf(tmp_path / "g.gguf", "gemma3", GEMMA3_METADATA, {})
    config = gguf_llama.hf_config(reader)
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["model_type"] == "gemma3_text" and config["tie_word_embeddings"]
    assert config["query_pre_attn_scalar"] == 16  # head_dim, as llama.cpp scales below 27B
    full = [i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention"]
    assert full == [5, 11] and config["sliding_window"] == 512
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0


def test_gemma3s_linear_rope_scaling_applies_to_its_global_layers(tmp_path):
    metadata = GEMMA3_METADATA | {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0}
    config = gguf_llama.hf_config(write_gguf(tmp_path / "g.gguf", "gemma3", metadata, {}))
    from sluice.models.families.registry import parse_hf_config

    parsed = parse_hf_config(config)
    assert parsed.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert parsed.rope_local_theta == 10000.0


def test_gemma3s_stored_norms_lose_the_one_llama_cpp_added(tmp_path):
    tensors = {"blk.0.attn_q_norm.weight": np.array([1.5, 0.75, 1.0, 2.0], dtype=np.float32)}
    reader = write_gguf(tmp_path / "n.gguf", "gemma3", GEMMA3_METADATA, tensors)
    ((name, weights),) = gguf_llama.hf_tensors(reader, gguf_llama.hf_config(reader))
    assert name == "model.layers.0.self_attn.q_norm.weight"
    np.testing.assert_array_equal(weights, [0.5, -0.25, 0.0, 1.0])
