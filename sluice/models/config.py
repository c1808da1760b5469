"""The shape of a Llama-family model, parsed once from an HF `config.json` dict.

`LlamaConfig` covers Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Phi-3 and
Gemma 3 (text): one decoder with RMSNorm, a gated MLP, grouped-query attention
and rotary embeddings. Qwen3 adds a per-head RMSNorm of q and k; Phi-3 stores
q/k/v and gate/up fused and may attend within a window; Gemma 3 adds
those too, (1 + weight) norms before and after attention and the MLP, a scaled
embedding, GeGLU, its own attention scale and sliding-window layers between
global ones (`layer_types`), each kind with its own RoPE base.
Invariants of a parsed config:

- `architecture` is one of `SUPPORTED_ARCHITECTURES`;
- `rope_scaling` is None (plain RoPE) or a dict whose "rope_type" is one of
  `SUPPORTED_ROPE_TYPES`, with `rope_theta` kept apart in its own field, the
  same whichever of the two layouts the file used (transformers < 5:
  top-level `rope_theta` + `rope_scaling`; transformers 5: `rope_parameters`);
- attention is full attention, except "sliding_attention" layers
  (`layer_types`: Gemma 3's local ones, every Phi-3 layer when its window is
  shorter than the context), which see the last `sliding_window` positions: elsewhere a
  sliding window shorter than `max_position_embeddings` is refused, a longer
  one is ignored;
- `rotary_dim` (even, at most `head_dim`) is how many leading dims of each
  q/k head RoPE rotates; the rest pass through (Phi-4-mini: 3/4 of the head).

Anything the model code cannot run raises `ModelLoadError` with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.longrope import LONGROPE, LONGROPE_ALIASES, parse_longrope

GEMMA3 = "Gemma3ForCausalLM"
GEMMA2 = "Gemma2ForCausalLM"
PHI3 = "Phi3ForCausalLM"
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", GEMMA3,
    GEMMA2, PHI3,
)  # fmt: skip
# "freq_factors": llama.cpp's per-dimension divisors of the frequencies (a
# GGUF's rope_freqs tensor, how its converter stores Llama 3.1+'s llama3 scaling).
# "longrope": Phi-3.5/Phi-4-mini's (sluice/models/longrope.py).
SUPPORTED_ROPE_TYPES = ("linear", "llama3", "freq_factors", LONGROPE)
# Older files without "architectures" still name their family.
_ARCHITECTURE_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": GEMMA3,
    "gemma2": GEMMA2,
    "phi3": PHI3,
}
SLIDING, FULL = "sliding_attention", "full_attention"
# Gemma 3's defaults: the local layers' RoPE base, one global layer in six.
_GEMMA3_LOCAL_ROPE_THETA = 10000.0
_GEMMA3_SLIDING_PATTERN = 6
_DEFAULT_ROPE_THETA = 10000.0


class UnsupportedRopeScalingError(ModelLoadError, ValueError):
    """A `rope_scaling` type the model code does not implement.

    A ValueError too, so callers validating configs can catch it as one.
    """


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    # "LlamaForCausalLM", "MistralForCausalLM" or "Qwen2ForCausalLM".
    architecture: str
    vocab_size: int
    hidden_size: int
    # Width of the SwiGLU MLP (gate and up projections).
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    # Fewer than num_attention_heads means grouped-query attention.
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    # None for plain RoPE, else {"rope_type": one of SUPPORTED_ROPE_TYPES, ...parameters}.
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    # lm_head shares the embedding matrix (no lm_head.weight in the checkpoint).
    tie_word_embeddings: bool
    # q/k/v projections carry a bias (Qwen2 always; Llama when attention_bias).
    attention_bias: bool
    # o_proj carries a bias (Llama with attention_bias; never Qwen2 or Mistral).
    o_proj_bias: bool
    # The window of "sliding_attention" layers (Gemma 3); elsewhere the
    # declared window, kept for reference, always >= max_position_embeddings.
    sliding_window: int | None
    bos_token_id: int | None
    # q and k get a per-head RMSNorm (weights [head_dim]) before RoPE (Qwen3, Gemma 3).
    has_qk_norm: bool = False
    # The gate's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma).
    hidden_act: str = "silu"
    # Attention scores scale by query_pre_attn_scalar ** -0.5 (Gemma); None: head_dim.
    query_pre_attn_scalar: float | None = None
    # Per layer, "sliding_attention" or "full_attention"; empty: all full.
    layer_types: tuple[str, ...] = ()
    # RoPE base of the sliding layers (Gemma 3's local base; no scaling there).
    rope_local_theta: float | None = None
    # Logits become cap * tanh(logits / cap) (Gemma); None: no cap.
    final_logit_softcapping: float | None = None
    # Attention scores capped the same way before the softmax (Gemma 2); None: no cap.
    attn_logit_softcapping: float | None = None
    # RoPE rotates the first rotary_dim dims of each q/k head and passes the
    # rest through (Phi-4-mini: partial_rotary_factor 0.75); None: head_dim.
    rotary_dim: int | None = None

    def __post_init__(self) -> None:
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)

    @property
    def has_partial_rotary(self) -> bool:
        """RoPE leaves some dims of each head unrotated (Phi-4-mini)."""
        return self.rotary_dim != self.head_dim

    @property
    def is_gemma3(self) -> bool:
        return self.architecture == GEMMA3

    @property
    def is_gemma(self) -> bool:
        """(1 + weight) norms, pre and post norms, the scaled embedding (gemma3.py)."""
        return self.architecture in (GEMMA3, GEMMA2)

    @property
    def has_fused_checkpoint(self) -> bool:
        """The checkpoint holds qkv_proj and gate_up_proj whole (Phi-3)."""
        return self.architecture == PHI3

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one KV head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """Parse an HF config.json dict; raise ModelLoadError on what we cannot run."""
        architecture = _architecture(d)
        if architecture in (GEMMA3, GEMMA2):
            return _checked(cls(**_gemma_fields(d, architecture)))
        _check_mlp(d)
        fields = _common_fields(d, architecture)
        max_positions = fields["max_position_embeddings"]
        if architecture == PHI3:
            fields |= _phi3_fields(d, fields)
        else:
            fields["sliding_window"] = _sliding_window(d, max_positions)
        fields["has_qk_norm"] = architecture == "Qwen3ForCausalLM"
        return _checked(cls(**fields))


def _common_fields(d: dict[str, Any], architecture: str) -> dict[str, Any]:
    """The fields every family reads the same way."""
    hidden_size = _require_int(d, "hidden_size")
    num_heads = _require_int(d, "num_attention_heads")
    max_positions = _require_int(d, "max_position_embeddings")
    rope_theta, rope_scaling = _rope(d, max_positions)
    head_dim = int(d.get("head_dim") or hidden_size // num_heads)
    is_qwen2 = architecture == "Qwen2ForCausalLM"
    has_bias = bool(d.get("attention_bias", False))
    return {
        "architecture": architecture,
        "vocab_size": _require_int(d, "vocab_size"),
        "hidden_size": hidden_size,
        "intermediate_size": _require_int(d, "intermediate_size"),
        "num_hidden_layers": _require_int(d, "num_hidden_layers"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(d.get("num_key_value_heads") or num_heads),
        "head_dim": head_dim,
        "rotary_dim": _rotary_dim(d, head_dim, architecture),
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", False)),
        "attention_bias": is_qwen2 or has_bias,
        "o_proj_bias": has_bias and not is_qwen2,
        "sliding_window": None,
        "bos_token_id": d.get("bos_token_id"),
    }


def _gemma_fields(d: dict[str, Any], architecture: str) -> dict[str, Any]:
    """Gemma 3 (text) and Gemma 2: Gemma's own defaults, the window, the RoPE
    bases (Gemma 2: one for both kinds of layer) and the caps."""
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ModelLoadError(f"unsupported Gemma activation {act!r}; only 'gelu_pytorch_tanh'")
    is_gemma2 = architecture == GEMMA2
    if d.get("attn_logit_softcapping") is not None and not is_gemma2:
        raise ModelLoadError("unsupported attn_logit_softcapping: attention scores are not capped")
    if d.get("use_bidirectional_attention"):
        raise ModelLoadError("unsupported use_bidirectional_attention: generation is causal")
    d = {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, **d}
    fields = _common_fields(d, architecture)
    pattern = 2 if is_gemma2 else _GEMMA3_SLIDING_PATTERN
    layer_types = _gemma_layer_types(d, fields["num_hidden_layers"], pattern)
    window = d.get("sliding_window")
    if SLIDING in layer_types and not window:
        raise ModelLoadError("Gemma 3 sliding-window layers need 'sliding_window'")
    local = (d.get("rope_parameters") or {}).get(SLIDING) or {}
    local_theta = local.get("rope_theta") or d.get("rope_local_base_freq")
    if is_gemma2:
        local_theta = fields["rope_theta"]
    cap, attn_cap = d.get("final_logit_softcapping"), d.get("attn_logit_softcapping")
    return fields | {
        "sliding_window": int(window) if window else None,
        "has_qk_norm": not is_gemma2,
        "attn_logit_softcapping": None if attn_cap is None else float(attn_cap),
        "hidden_act": act,
        "query_pre_attn_scalar": float(d.get("query_pre_attn_scalar") or fields["head_dim"]),
        "layer_types": layer_types,
        "rope_local_theta": float(local_theta or _GEMMA3_LOCAL_ROPE_THETA),
        "final_logit_softcapping": None if cap is None else float(cap),
    }


def _phi3_fields(d: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Phi-3: every layer attends within `sliding_window` where it is shorter
    than the context (Phi-3-mini-4k: 2047 of 4096), as transformers runs it."""
    window = d.get("sliding_window")
    if window is None or int(window) >= fields["max_position_embeddings"]:
        return {"sliding_window": None}
    return {"sliding_window": int(window), "layer_types": (SLIDING,) * fields["num_hidden_layers"]}


def _gemma_layer_types(d: dict[str, Any], num_layers: int, pattern: int) -> tuple[str, ...]:
    types = d.get("layer_types")
    if types is None:
        pattern = int(d.get("sliding_window_pattern") or pattern)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise ModelLoadError(
            f"layer_types must name {SLIDING!r} or {FULL!r} for each of {num_layers} layers"
        )
    return tuple(types)


def _checked(config: LlamaConfig) -> LlamaConfig:
    _check_heads(config)
    return config


def _architecture(d: dict[str, Any]) -> str:
    names = d.get("architectures") or []
    if not names and d.get("model_type") in _ARCHITECTURE_BY_MODEL_TYPE:
        names = [_ARCHITECTURE_BY_MODEL_TYPE[d["model_type"]]]
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    shown = ", ".join(names) or f"model_type {d.get('model_type')!r}"
    raise ModelLoadError(
        f"unsupported architecture {shown}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _require_int(d: dict[str, Any], key: str) -> int:
    if d.get(key) is None:
        raise ModelLoadError(f"config.json lacks {key!r}")
    return int(d[key])


def _check_mlp(d: dict[str, Any]) -> None:
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is supported")
    if d.get("mlp_bias", False):
        raise ModelLoadError("unsupported mlp_bias=true; the MLP projections must have no bias")


def _check_heads(config: LlamaConfig) -> None:
    if config.num_attention_heads % config.num_key_value_heads:
        raise ModelLoadError(
            f"num_attention_heads {config.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {config.num_key_value_heads}"
        )


def _rope(d: dict[str, Any], max_positions: int) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, normalised rope_scaling) from either config layout."""
    params = dict(d.get("rope_parameters") or {})
    if isinstance(params.get("full_attention"), dict):  # per-layer-type layout
        params = dict(params["full_attention"])
    theta = params.pop("rope_theta", None) or d.get("rope_theta") or _DEFAULT_ROPE_THETA
    scaling = params if params.get("rope_type", params.get("type")) else d.get("rope_scaling")
    original = d.get("original_max_position_embeddings")
    return float(theta), _normalise_rope_scaling(scaling, max_positions, original)


def _rotary_dim(d: dict[str, Any], head_dim: int, architecture: str) -> int:
    """How many dims of each head RoPE rotates: int(head_dim * partial_rotary_factor),
    as transformers derives it, the factor read at the top level or inside
    rope_parameters / rope_scaling (transformers 5 writes both)."""
    params = d.get("rope_parameters") or {}
    if isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    sources = (params, d.get("rope_scaling") or {}, d)
    value = next((s["partial_rotary_factor"] for s in sources if s.get("partial_rotary_factor")), 1)
    if not isinstance(value, int | float):
        raise ModelLoadError(f"partial_rotary_factor must be a number, got {value!r}")
    factor = float(value)
    if factor == 1.0:
        return head_dim
    rotary_dim = int(head_dim * factor)
    if architecture != PHI3:
        raise ModelLoadError(
            f"unsupported partial_rotary_factor {factor} for {architecture}: "
            "only Phi-3 (Phi-4-mini) rotates part of each head"
        )
    if not 0.0 < factor < 1.0 or rotary_dim < 2 or rotary_dim % 2:
        raise ModelLoadError(
            f"unsupported partial_rotary_factor {factor}: RoPE needs an even number of "
            f"dims of the {head_dim} in a head, got {rotary_dim}"
        )
    return rotary_dim


def _normalise_rope_scaling(
    scaling: dict[str, Any] | None, max_positions: int, original: int | None
) -> dict[str, Any] | None:
    if not scaling:
        return None
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type in LONGROPE_ALIASES:
        return parse_longrope(scaling, original, max_positions)
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_type", "type", "rope_theta")}
    if rope_type == "default":
        return None
    if rope_type == "dynamic":
        raise UnsupportedRopeScalingError(
            "rope_scaling type 'dynamic' (dynamic NTK) is not supported: it changes the "
            "frequencies with the sequence length; supported: " + ", ".join(SUPPORTED_ROPE_TYPES)
        )
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedRopeScalingError(
            f"unsupported rope_scaling type {rope_type!r}; supported: "
            + ", ".join(SUPPORTED_ROPE_TYPES)
        )
    if rope_type == "freq_factors":
        if not isinstance(scaling.get("factors"), list):
            raise ModelLoadError("rope_scaling type 'freq_factors' lacks its 'factors' list")
        return {"rope_type": rope_type, "factors": [float(f) for f in scaling["factors"]]}
    if "factor" not in scaling:
        raise ModelLoadError(f"rope_scaling type {rope_type!r} lacks 'factor'")
    if rope_type == "llama3":
        scaling.setdefault("original_max_position_embeddings", max_positions)
        for key in ("low_freq_factor", "high_freq_factor"):
            if key not in scaling:
                raise ModelLoadError(f"rope_scaling type 'llama3' lacks {key!r}")
    return {"rope_type": rope_type, **scaling}


def _sliding_window(d: dict[str, Any], max_positions: int) -> int | None:
    # Qwen2 files declare a window but switch it off with use_sliding_window.
    if not d.get("use_sliding_window", True):
        return None
    window = d.get("sliding_window")
    if window is not None and int(window) < max_positions:
        raise ModelLoadError(
            f"sliding window attention is unsupported (sliding_window {window} < "
            f"max_position_embeddings {max_positions})"
        )
    return None if window is None else int(window)
