"""Tiny models written as GGUF files the way llama.cpp's converter writes them.

`write_tiny_gguf` takes a tiny HF model (tests/model_factory.py): q/k rows
permuted, llama3 rope scaling as a rope_freqs tensor, a byte-level BPE
vocabulary; `block_type` names a GGUF block type (or gives one per tensor)
for the 2-D weights whose rows are whole blocks of it, quantized by
gguf-py or tests/gguf_quants.py.
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from sluice.loader.gguf_blocks import FORMATS
from sluice.tokenizer import _unicode_to_byte
from tests.gguf_quants import K_QUANT_WRITERS
from tests.model_factory import TinyModel

_LAYER_STEMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
TINY_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    half = weights.shape[0] // num_heads // 2
    return (
        weights.reshape(num_heads, 2, half, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, *stem, kind = hf_name.split(".")
    return f"blk.{layer}.{_LAYER_STEMS['.'.join(stem)]}.{kind}"


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors):
    llama3 scaling as per-dimension divisors of the frequencies."""
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_tiny_gguf(
    tiny: TinyModel, path: Path, block_type: str | Callable[[str], str | None] | None = None
) -> Path:
    """The tiny HF model as llama.cpp's converter would write it (q/k permuted,
    llama3 rope scaling as a rope_freqs tensor), float32, or with its 2-D
    weights in `block_type` (a name, or HF name -> name or None)."""
    config = tiny.config_dict
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    add_byte_bpe_vocab(writer, config["vocab_size"], ["<|endoftext|>", "<s>", "</s>"])
    writer.add_chat_template(TINY_TEMPLATE)
    rope = config["rope_parameters"]
    if rope.get("rope_type") == "llama3":
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
    for name, tensor in tiny.weights():
        array = tensor.numpy()
        if ".q_proj." in name:
            array = llama_cpp_permute(array, config["num_attention_heads"])
        elif ".k_proj." in name:
            array = llama_cpp_permute(array, config["num_key_value_heads"])
        kind = block_type(name) if callable(block_type) else block_type
        if (
            kind is None
            or array.ndim != 2
            or array.shape[1] % GGML_QUANT_SIZES[GGMLQuantizationType[kind]][0]
        ):
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(array))
        else:
            writer.add_tensor(
                gguf_name(name), _blocks(array, kind), raw_dtype=GGMLQuantizationType[kind]
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# LFM2's HF per-layer modules -> llama.cpp's stems (its conv layers' `shortconv.*`).
_LFM2_STEMS = {
    "operator_norm": "attn_norm", "ffn_norm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_output", "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm", "feed_forward.w1": "ffn_gate",
    "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down", "conv.conv": "shortconv.conv",
    "conv.in_proj": "shortconv.in_proj", "conv.out_proj": "shortconv.out_proj",
}  # fmt: skip


def write_tiny_lfm2_gguf(tiny: TinyModel, path: Path, mlp_width: int) -> Path:
    """A tiny LFM2 as llama.cpp's converter writes it (convert_hf_to_gguf.py
    LFM2Model): KV heads per layer, 0 for a conv layer; `shortconv.l_cache`;
    the MLP width already derived (`mlp_width`); conv kernels squeezed to
    [hidden, L]; the final norm as `token_embd_norm`; float32."""
    config = tiny.config_dict
    writer = GGUFWriter(str(path), "lfm2")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(mlp_width)
    writer.add_head_count(config["num_attention_heads"])
    kv = config["num_key_value_heads"]
    writer.add_head_count_kv([kv if t == "full_attention" else 0 for t in config["layer_types"]])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["norm_eps"])
    writer.add_shortconv_l_cache(config["conv_L_cache"])
    writer.add_vocab_size(config["vocab_size"])
    add_byte_bpe_vocab(writer, config["vocab_size"], ["<|endoftext|>", "<s>", "</s>"])
    writer.add_chat_template(TINY_TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.embedding_norm.weight": "token_embd_norm.weight"}  # fmt: skip
    for name, tensor in tiny.weights():
        array = tensor.numpy()
        if name.endswith("conv.conv.weight"):
            array = array.squeeze(1)
        if name not in names:
            _, _, layer, *stem, kind = name.split(".")
            names[name] = f"blk.{layer}.{_LFM2_STEMS['.'.join(stem)]}.{kind}"
        writer.add_tensor(names[name], np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _blocks(array: np.ndarray, kind: str) -> np.ndarray:
    values = np.ascontiguousarray(array, dtype=np.float32)
    if kind not in FORMATS and kind not in K_QUANT_WRITERS:
        # A type nothing here encodes (IQ*, TQ*): random codes of its size.
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        shape = (values.shape[0], values.shape[1] // block * size)
        return np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    if kind in K_QUANT_WRITERS:
        return K_QUANT_WRITERS[kind](values)[0]
    from gguf import quants

    return quants.quantize(values, GGMLQuantizationType[kind])


def add_byte_bpe_vocab(writer: GGUFWriter, vocab_size: int, specials: list[str]) -> None:
    """A byte-level BPE vocabulary: `specials`, the 256 byte symbols, then
    letter pairs (bos 1, eos 2)."""
    table = _unicode_to_byte()
    byte_symbols = sorted(table, key=table.__getitem__)
    num_merges = vocab_size - len(specials) - len(byte_symbols)
    pairs = list(itertools.islice(itertools.product(string.ascii_lowercase, repeat=2), num_merges))
    tokens = specials + byte_symbols + [a + b for a, b in pairs]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    writer.add_token_merges([f"{a} {b}" for a, b in pairs])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


_MOE_STEMS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
}  # fmt: skip
_EXPERT_STEMS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                 "down_proj": "ffn_down_exps"}  # fmt: skip
_MOE_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
               "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip


def moe_gguf_tensors(tiny: TinyModel) -> dict[str, np.ndarray]:
    """A tiny Qwen3-MoE (8 experts) as llama.cpp's qwen3moe names its tensors:
    GGUF name -> float32 array, the experts stacked per layer and projection."""
    config = tiny.config_dict
    weights = {name: t.numpy() for name, t in tiny.weights()}
    tensors = {gguf: weights[hf] for hf, gguf in _MOE_GLOBAL.items()}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for stem, gguf in _MOE_STEMS.items():
            tensors[f"blk.{layer}.{gguf}.weight"] = weights[f"{prefix}{stem}.weight"]
        for proj, gguf in _EXPERT_STEMS.items():
            stacked = [weights[f"{prefix}mlp.experts.{e}.{proj}.weight"] for e in range(8)]
            tensors[f"blk.{layer}.{gguf}.weight"] = np.stack(stacked)  # [E, out, in]
    return tensors
