"""What a GGUF means in Hugging Face terms: its config and its tensors.

Architectures (`general.architecture`): llama (Llama, SmolLM2, Mistral as
llama.cpp writes them), qwen2 (Qwen2/2.5), qwen3, gemma2, gemma3, smollm3 and phi3 (Phi-3; LongRoPE's
rope_factors_long/short tensors become the config's "longrope" scaling), qwen3moe, gpt-oss
(its MXFP4 expert stacks read by loader/gguf_mxfp4.py), qwen35 (Qwen3.5) and
granitehybrid (Granite 4.0-H), each with llama.cpp's tensor names and metadata
keys (each family's `GgufFamily`, sluice/models/families/). Read with
`gguf.GGUFReader` (memory-mapped, fast); no transformers here.

Invariants of what this module yields:
- tensor names are the HF names of the family (`model.layers.N.self_attn.q_proj.weight`, ...);
- shapes are HF shapes (`[out_features, in_features]`): GGUF lists dimensions
  fastest-first, so they are reversed;
- llama's attn_q / attn_k rows are un-permuted: llama.cpp's converter
  interleaves each head's two rotary halves for its RoPE kernel; HF keeps them
  split (`rotate_half`). The inverse here is the one transformers' GGUF loader
  applies. qwen2, qwen3, gemma3 and phi3 use the NeoX rotation, stored as HF stores it;
- gemma2's and gemma3's norm weights are HF's: llama.cpp's converter stores 1 + weight
  (Gemma multiplies by it), so the 1 is taken off again;
- values are dequantized float32 by `gguf.quants.dequantize`, the reference
  port of llama.cpp's block layouts (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K
  quants Q2_K to Q6_K, F16, BF16, F32): exact, since every type's values are
  small integers times float16 scales, which float32 holds exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from sluice.errors import ModelLoadError
from sluice.models.families.family import Family, GgufFamily
from sluice.models.families.registry import gguf_family

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
# A stem may hold dots (LFM2's `shortconv.in_proj`).
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.([\w.]+)\.(weight|bias)")
# Any layer tensor: a family may name one whole, suffix or none (qwen35's `ssm_a`).
_ANY_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.([\w.]+)")
# The HF name a family gives llama.cpp's stacked experts (families/qwen_moe.py).
_STACKED_EXPERTS = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\w+\.weight)")
ROPE_FREQS = "rope_freqs.weight"
# The stacks a family with `release_experts` may hold in MXFP4 (loader/gguf_mxfp4.py).
_MXFP4_STACK = re.compile(r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight")
# LongRoPE's factor lists (Phi-3-128k, Phi-3.5), as llama.cpp's converter stores them.
LONGROPE_FACTORS = {
    "long_factor": "rope_factors_long.weight",
    "short_factor": "rope_factors_short.weight",
}
_CONFIG_TENSORS = (ROPE_FREQS, *LONGROPE_FACTORS.values())
# The tensor types sluice reads (kept as blocks: loader/gguf_blocks.py; the
# rest dequantized). IQ* and TQ* (lattice and ternary codes) are refused at
# once rather than silently widened to float32, 8-16x the file.
READABLE_TYPES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)  # fmt: skip


def field_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value (scalar, string or list), or `default` when absent."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def family(reader: GGUFReader) -> Family:
    """The family the GGUF's `general.architecture` names (ModelLoadError if none)."""
    return gguf_family(field_value(reader, "general.architecture"))


def hf_config(reader: GGUFReader) -> dict[str, Any]:
    """An HF `config.json` dict for a supported GGUF, from its metadata."""
    check_tensor_types(reader)
    hf_family = family(reader)
    gguf = hf_family.gguf
    assert gguf is not None, "the registry finds only families with a GGUF layout"
    arch = gguf.architecture

    def meta(key: str, default: Any = None) -> Any:
        return field_value(reader, f"{arch}.{key}", default)

    num_heads = meta("attention.head_count")
    hidden_size = meta("embedding_length")
    head_dim = meta("attention.key_length", hidden_size // num_heads)
    rope_dim = meta("rope.dimension_count", head_dim)
    rope_scaling = _rope_scaling(reader, arch) | _partial_rotary(hf_family, rope_dim, head_dim)
    tensor_names = {tensor.name for tensor in reader.tensors}
    rope_theta = float(meta("rope.freq_base", 10000.0))
    vocab_size = meta("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    config = {
        "architectures": [hf_family.architecture],
        "model_type": hf_family.model_type,
        "hidden_size": hidden_size,
        "intermediate_size": meta("feed_forward_length"),
        # llama.cpp counts multi-token-prediction layers (nextn) among the blocks; sluice skips them.
        "num_hidden_layers": meta("block_count") - meta("nextn_predict_layers", 0),
        "num_attention_heads": num_heads,
        "num_key_value_heads": meta("attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": meta("context_length"),
        "vocab_size": vocab_size,
        # Written both ways: transformers 5 reads rope_parameters, older readers rope_theta.
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta, **rope_scaling},
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        # GGUF drops output.weight when the head shares the embedding.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
    }
    if gguf.config_entries is not None:
        config |= gguf.config_entries(config, meta)
    for key in ("original_max_position_embeddings", "partial_rotary_factor"):
        if key in rope_scaling:  # Phi3Config reads them at top level too
            config[key] = rope_scaling[key]
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        token_id = field_value(reader, f"tokenizer.ggml.{key}")
        if token_id is not None:
            config[key.replace("padding", "pad")] = int(token_id)
    if stops := _stop_token_ids(reader, gguf.stop_tokens):
        eos = [config["eos_token_id"]] if "eos_token_id" in config else []
        config["eos_token_id"] = list(dict.fromkeys(eos + stops))
    return config


def _stop_token_ids(reader: GGUFReader, texts: tuple[str, ...]) -> list[int]:
    """The ids of the vocabulary's tokens spelled `texts` (absent ones skipped)."""
    if not texts:
        return []
    tokens = field_value(reader, "tokenizer.ggml.tokens", [])
    ids = {token: index for index, token in enumerate(tokens) if token in texts}
    return [ids[text] for text in texts if text in ids]


def _partial_rotary(hf_family: Family, rope_dim: int, head_dim: int) -> dict[str, Any]:
    """Phi-4-mini's partial rotary as rope_parameters say it: llama.cpp writes
    the rotated dims (`rope.dimension_count`), transformers reads
    rotary_dim = int(head_dim * partial_rotary_factor); {} for whole heads."""
    if rope_dim == head_dim:
        return {}
    factor = rope_dim / head_dim
    if not hf_family.partial_rotary or int(head_dim * factor) != rope_dim:
        raise ModelLoadError(f"unsupported GGUF: partial rotary ({rope_dim} of {head_dim} dims)")
    return {"partial_rotary_factor": factor}


def _rope_scaling(reader: GGUFReader, arch: str) -> dict[str, Any]:
    """The rope_parameters entries of a GGUF's rope scaling (linear: Gemma 3 4B+;
    yarn; llama3 as rope_freqs; LongRoPE); {} for none."""
    scaling = field_value(reader, f"{arch}.rope.scaling.type", "none")
    if longrope := _longrope(reader, arch):
        return longrope
    factors = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if factors is not None and scaling in ("none", "llama3"):
        # Llama 3.1+: llama.cpp's converter stores the llama3 scaling as
        # per-dimension divisors of the frequencies.
        values = _dequantize(factors).astype(np.float32).reshape(-1)
        return {"rope_type": "freq_factors", "factors": [float(f) for f in values]}
    if factors is not None:
        raise ModelLoadError(f"unsupported GGUF: rope_freqs with rope scaling {scaling!r}")
    if scaling == "none":
        return {}
    if scaling == "yarn":
        return _yarn(reader, arch)
    factor = field_value(reader, f"{arch}.rope.scaling.factor")
    if scaling != "linear" or factor is None:
        raise ModelLoadError(f"unsupported GGUF rope scaling {scaling!r}")
    return {"rope_type": "linear", "factor": float(factor)}


def _yarn(reader: GGUFReader, arch: str) -> dict[str, Any]:
    """YaRN's rope_parameters entries, from the keys llama.cpp's converter
    writes (`rope.scaling.yarn_*`); transformers has no extrapolation factor
    but 1, so another one is refused."""

    def scaling(key: str) -> Any:
        return field_value(reader, f"{arch}.rope.scaling.{key}")

    factor, original = scaling("factor"), scaling("original_context_length")
    if factor is None or original is None:
        raise ModelLoadError(
            f"unsupported GGUF: yarn rope scaling needs {arch}.rope.scaling.factor and "
            "original_context_length"
        )
    if scaling("yarn_ext_factor") not in (None, 1.0):
        raise ModelLoadError(f"unsupported GGUF: yarn_ext_factor {scaling('yarn_ext_factor')}")
    entries: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
    entries["original_max_position_embeddings"] = int(original)
    for key, hf_key in (("yarn_attn_factor", "attention_factor"),
                        ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):  # fmt: skip
        if (value := scaling(key)) is not None:
            entries[hf_key] = float(value)
    return entries


def _longrope(reader: GGUFReader, arch: str) -> dict[str, Any]:
    """LongRoPE's rope_parameters entries: the two lists from their tensors,
    the original context and attention factor from the metadata; {} for none."""
    tensors = {t.name: t for t in reader.tensors if t.name in LONGROPE_FACTORS.values()}
    if not tensors:
        return {}
    original = field_value(reader, f"{arch}.rope.scaling.original_context_length")
    if len(tensors) != len(LONGROPE_FACTORS) or original is None:
        raise ModelLoadError(
            "unsupported GGUF: LongRoPE needs rope_factors_long, rope_factors_short and "
            f"{arch}.rope.scaling.original_context_length"
        )
    scaling: dict[str, Any] = {
        "rope_type": "longrope",
        "original_max_position_embeddings": int(original),
    }
    for key, name in LONGROPE_FACTORS.items():
        scaling[key] = [float(f) for f in _dequantize(tensors[name]).astype(np.float32).reshape(-1)]
    attention_factor = field_value(reader, f"{arch}.rope.scaling.attn_factor")
    if attention_factor is not None:
        scaling["attention_factor"] = float(attention_factor)
    return scaling


def check_tensor_types(reader: GGUFReader) -> None:
    """ModelLoadError naming the first tensor whose type sluice cannot read
    (MXFP4 is read in the expert stacks of a family that keeps them: gpt-oss)."""
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind == "MXFP4" and _MXFP4_STACK.fullmatch(tensor.name):
            gguf = family(reader).gguf
            if gguf is not None and gguf.release_experts:
                continue
        if kind not in READABLE_TYPES:
            raise ModelLoadError(
                f"unsupported GGUF tensor type {tensor.tensor_type.name} (tensor "
                f"{tensor.name}): sluice reads {', '.join(READABLE_TYPES)}; requantize the "
                "model with llama-quantize (e.g. to Q4_K_M)"
            )


def hf_tensors(reader: GGUFReader, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array in HF shape) for every tensor of the GGUF."""
    gguf = family(reader).gguf
    for tensor, name, heads in model_tensors(reader, config):
        yield from per_expert(name, hf_array(tensor, name, heads, gguf, config))


def per_expert(name: str, weights: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """A stacked experts tensor (llama.cpp's `ffn_*_exps`, [E, out, in]) as
    HF's one tensor per expert (`mlp.experts.M.gate_proj.weight`); any other
    tensor as it is."""
    match = _STACKED_EXPERTS.fullmatch(name)
    if match is None:
        yield name, weights
        return
    if weights.ndim != 3:
        raise ModelLoadError(f"GGUF experts tensor {name} has shape {weights.shape}, not 3-D")
    for expert, matrix in enumerate(weights):
        yield f"{match[1]}.{expert}.{match[2]}", matrix


def model_tensors(
    reader: GGUFReader, config: dict[str, Any]
) -> Iterator[tuple[Any, str, int | None]]:
    """(GGUF tensor, its HF name, the heads its rows are permuted by or None)
    for every tensor that is part of the model (rope factors are the config's)."""
    gguf = family(reader).gguf
    for tensor in reader.tensors:
        if tensor.name in _CONFIG_TENSORS:
            continue  # in the config's rope_parameters (`_rope_scaling`)
        if _nextn_layer(tensor.name, config):
            continue  # a multi-token-prediction layer past the decoder's (not served)
        heads = None
        if gguf.permutes_qk and ".attn_q." in tensor.name:
            heads = config["num_attention_heads"]
        elif gguf.permutes_qk and ".attn_k." in tensor.name:
            heads = config["num_key_value_heads"]
        yield tensor, hf_tensor_name(tensor.name, gguf), heads


def _nextn_layer(gguf_name: str, config: dict[str, Any]) -> bool:
    """Whether `gguf_name` belongs to a layer past the config's decoder layers."""
    match, layers = _ANY_LAYER_TENSOR.fullmatch(gguf_name), config.get("num_hidden_layers")
    return match is not None and layers is not None and int(match[1]) >= layers


def hf_array(
    tensor: Any,
    name: str,
    heads: int | None,
    gguf: GgufFamily,
    config: dict[str, Any] | None = None,
) -> np.ndarray:
    """One tensor dequantized to float32 in HF's shape, rows unpermuted, norms
    unshifted, the family's other changes undone (`GgufFamily.restore`, given
    the HF `config`)."""
    # GGUF dims are fastest-first; HF (row-major) lists them slowest-first.
    weights = _dequantize(tensor).reshape(tuple(reversed([int(n) for n in tensor.shape])))
    if heads is not None:
        weights = unpermute_rope_rows(weights, heads)
    if gguf.norm_shift and name.endswith("norm.weight"):
        weights = weights - np.float32(gguf.norm_shift)
    if (undo := restorer(gguf, name, config)) is not None:
        weights = undo(np.asarray(weights, dtype=np.float32))
    return np.ascontiguousarray(weights, dtype=np.float32)


def restorer(
    gguf: GgufFamily, name: str, config: dict[str, Any] | None
) -> Callable[[np.ndarray], np.ndarray] | None:
    """The family's undoing of the converter's change to tensor `name`; None for none."""
    if gguf.restore is None or config is None:
        return None
    return gguf.restore(name, config)


def hf_tensor_name(gguf_name: str, family: GgufFamily | None = None) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; a
    family's own stems (`family.layer_names`) on top of llama's."""
    whole = _ANY_LAYER_TENSOR.fullmatch(gguf_name)
    if whole is not None and family is not None and whole[2] in family.layer_names:
        return f"model.layers.{whole[1]}.{family.layer_names[whole[2]]}"
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is not None:
        layer, stem, kind = match.groups()
        names = _LAYER_NAMES | (family.layer_names if family is not None else {})
        if stem in names:
            return f"model.layers.{layer}.{names[stem]}.{kind}"
    stem, _, kind = gguf_name.rpartition(".")
    global_names = _GLOBAL_NAMES | (family.global_names if family is not None else {})
    if stem in global_names and kind in ("weight", "bias"):
        return f"{global_names[stem]}.{kind}"
    raise ModelLoadError(
        f"unsupported GGUF tensor {gguf_name!r} "
        f"(not part of a {family.architecture if family is not None else 'llama'} model)"
    )


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
