"""What a llama GGUF means in Hugging Face terms: its config and its tensors.

Read with `gguf.GGUFReader` (memory-mapped, fast); no transformers here.

Invariants of what this module yields:
- tensor names are the HF llama names (`model.layers.N.self_attn.q_proj.weight`, ...);
- shapes are HF shapes (`[out_features, in_features]`): GGUF lists dimensions
  fastest-first, so they are reversed;
- attn_q / attn_k rows are un-permuted: llama.cpp's converter interleaves each
  head's two rotary halves for its RoPE kernel; HF keeps them split
  (`rotate_half`). The inverse here is the one transformers' GGUF loader applies;
- values are dequantized float32 (Q4_1 and Q8_0 blocks are exact in float32).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from sluice.errors import ModelLoadError

SUPPORTED_ARCHITECTURE = "llama"

# GGUF per-layer tensor stem -> HF module path under model.layers.N.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def field_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value (scalar, string or list), or `default` when absent."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def architecture(reader: GGUFReader) -> str:
    arch = field_value(reader, "general.architecture")
    if arch != SUPPORTED_ARCHITECTURE:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}: sluice runs llama-family models"
        )
    return arch


def hf_config(reader: GGUFReader) -> dict[str, Any]:
    """An HF `config.json` dict for a llama GGUF, from its metadata."""
    arch = architecture(reader)

    def meta(key: str, default: Any = None) -> Any:
        return field_value(reader, f"{arch}.{key}", default)

    num_heads = meta("attention.head_count")
    hidden_size = meta("embedding_length")
    head_dim = meta("attention.key_length", hidden_size // num_heads)
    _check_rope(reader, meta("rope.dimension_count", head_dim), head_dim)
    tensor_names = {tensor.name for tensor in reader.tensors}
    rope_theta = float(meta("rope.freq_base", 10000.0))
    vocab_size = meta("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": meta("attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": meta("context_length"),
        "vocab_size": vocab_size,
        # Written both ways: transformers 5 reads rope_parameters, older readers rope_theta.
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        # GGUF drops output.weight when the head shares the embedding.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
    }
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        token_id = field_value(reader, f"tokenizer.ggml.{key}")
        if token_id is not None:
            config[key.replace("padding", "pad")] = int(token_id)
    return config


def _check_rope(reader: GGUFReader, rope_dim: int, head_dim: int) -> None:
    arch = SUPPORTED_ARCHITECTURE
    scaling = field_value(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ModelLoadError(f"unsupported GGUF rope scaling {scaling!r}")
    if any(tensor.name == "rope_freqs.weight" for tensor in reader.tensors):
        raise ModelLoadError("unsupported GGUF: per-dimension rope frequency factors (rope_freqs)")
    if rope_dim != head_dim:
        raise ModelLoadError(f"unsupported GGUF: partial rotary ({rope_dim} of {head_dim} dims)")


def hf_tensors(reader: GGUFReader, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array in HF shape) for every tensor of the GGUF."""
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        weights = _dequantize(tensor)
        # GGUF dims are fastest-first; HF (row-major) lists them slowest-first.
        weights = weights.reshape(tuple(reversed([int(n) for n in tensor.shape])))
        if ".attn_q." in tensor.name:
            weights = unpermute_rope_rows(weights, config["num_attention_heads"])
        elif ".attn_k." in tensor.name:
            weights = unpermute_rope_rows(weights, config["num_key_value_heads"])
        yield name, np.ascontiguousarray(weights, dtype=np.float32)


def hf_tensor_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is not None:
        layer, stem, kind = match.groups()
        if stem in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[stem]}.{kind}"
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES and kind in ("weight", "bias"):
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    raise ModelLoadError(f"unsupported GGUF tensor {gguf_name!r} (not part of a llama model)")


def unpermute_rope_rows(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation.

    llama.cpp stores, per head, rows ordered (dim/2 pairs, 2) -- i.e. the two
    rotary halves interleaved; HF orders them (2 halves, dim/2). Works for a
    weight [num_heads * head_dim, hidden] and a bias [num_heads * head_dim].
    """
    half = weights.shape[0] // num_heads // 2
    # [num_heads, half, 2, ...] -> [num_heads, 2, half, ...]
    per_head = weights.reshape(num_heads, half, 2, *weights.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weights.shape)


def _dequantize(tensor: Any) -> np.ndarray:
    try:
        return dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise ModelLoadError(
            f"unsupported GGUF quantization {tensor.tensor_type.name} in tensor {tensor.name}"
        ) from exc
