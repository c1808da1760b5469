"""The shape and numerics of a decoder, as the layers read them: `DecoderConfig`.

One decoder serves every family (sluice/models/families/): RMSNorm, a gated
MLP, grouped-query attention and rotary embeddings over a paged KV cache.
What differs between families is data here, set once by the family's parser
(`families/<family>.py`), never a test of the family's name in layer code:
q/k norms, an offset folded into norm weights, a scaled embedding, soft caps,
sliding-window layers with their own RoPE base, partial rotary, fused
checkpoint tensors. Invariants of a parsed config:

- `rope_scaling` is None (plain RoPE) or a dict whose "rope_type" is one of
  `families.hf_fields.SUPPORTED_ROPE_TYPES`, with `rope_theta` kept apart in
  its own field, the same whichever layout config.json used;
- attention is full attention, except "sliding_attention" layers
  (`layer_types`), which see the last `sliding_window` positions;
- `rotary_dim` (even, at most `head_dim`) is how many leading dims of each
  q/k head RoPE rotates; the rest pass through (Phi-4-mini: 3/4 of the head);
- `num_attention_heads` is a multiple of `num_key_value_heads`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.errors import ModelLoadError

SLIDING, FULL = "sliding_attention", "full_attention"
# A layer kind without attention: a short gated convolution over a
# per-sequence state (LFM2; sluice/models/short_conv.py).
CONV = "conv"
# A Mamba-2 layer over a per-sequence conv tail and SSM state (Granite 4.0-H;
# sluice/models/mamba2.py).
MAMBA = "mamba"
# A layer kind without attention: Gated DeltaNet linear attention over a
# per-sequence conv tail and recurrent state (Qwen3.5; models/gated_deltanet.py).
LINEAR = "linear_attention"


class UnsupportedRopeScalingError(ModelLoadError, ValueError):
    """A `rope_scaling` type the model code does not implement.

    A ValueError too, so callers validating configs can catch it as one.
    """


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    # The HF architecture name ("Qwen3ForCausalLM"), for messages and the
    # registry's lookup; layers never compare it.
    architecture: str
    vocab_size: int
    hidden_size: int
    # Width of the gated MLP (gate and up projections).
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
    # The window of "sliding_attention" layers; elsewhere the declared
    # window, kept for reference, always >= max_position_embeddings.
    sliding_window: int | None
    bos_token_id: int | None
    # q and k get a per-head RMSNorm (weights [head_dim]) before RoPE (Qwen3, Gemma 3).
    qk_norm: bool = False
    # The gate's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma).
    hidden_act: str = "silu"
    # Attention scores scale by query_pre_attn_scalar ** -0.5 (Gemma); None: head_dim.
    query_pre_attn_scalar: float | None = None
    # Per layer, "sliding_attention" or "full_attention"; empty: all full.
    layer_types: tuple[str, ...] = ()
    # RoPE base of the sliding layers (Gemma 3's local base; no scaling
    # there); None: the sliding layers rotate as the others do.
    rope_local_theta: float | None = None
    # Logits become cap * tanh(logits / cap) (Gemma); None: no cap.
    final_logit_softcapping: float | None = None
    # Attention scores capped the same way before the softmax (Gemma 2); None: no cap.
    attn_logit_softcapping: float | None = None
    # RoPE rotates the first rotary_dim dims of each q/k head and passes the
    # rest through (Phi-4-mini: partial_rotary_factor 0.75); None: head_dim.
    rotary_dim: int | None = None
    # Added to every norm weight as it is loaded, in float32 (Gemma's norms
    # multiply by 1 + weight; the plain RMSNorm then serves them).
    norm_offset: float = 0.0
    # The embedding is multiplied by this, rounded to the model dtype first
    # (Gemma: sqrt(hidden_size)); None: not scaled.
    embedding_scale: float | None = None
    # The checkpoint holds qkv_proj and gate_up_proj whole, in our row order (Phi-3).
    fused_checkpoint: bool = False
    # The kernel size of the "conv" layers' short convolution (its state keeps
    # this - 1 inputs per channel); 0: no such layer. Their projections carry
    # a bias where conv_bias (LFM2's conv_bias).
    conv_kernel_size: int = 0
    conv_bias: bool = False
    # Gated DeltaNet layers (LINEAR): key/query heads and value heads, and
    # their sizes; their conv kernel is conv_kernel_size. 0: no such layer.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    # Attention output times sigmoid(gate), the gate rows interleaved with
    # q_proj's per head (Qwen3.5's gated attention).
    attention_output_gate: bool = False
    # Indices of the layers that rotate nothing (SmolLM3's NoPE layers, one
    # in four): they run on identity angles (cos 1, sin 0); empty: all rotate.
    nope_layers: tuple[int, ...] = ()
    # Mixture of experts (sluice/models/moe.py): experts per MoE layer; 0: every MLP is dense.
    num_experts: int = 0
    # Experts each token is routed to (top-k).
    num_experts_per_tok: int = 0
    # Width of each expert's gated MLP.
    moe_intermediate_size: int = 0
    # How router logits become the k weights: one of moe.ROUTER_SCORINGS.
    router_scoring: str = "softmax_topk"
    # The k weights are scaled to sum to one (Qwen3-MoE's norm_topk_prob).
    norm_topk_prob: bool = False
    # Layers of an MoE model whose MLP stays dense (Qwen3-MoE's mlp_only_layers).
    dense_mlp_layers: tuple[int, ...] = ()
    # Width of a shared expert every token runs, gated by sigmoid(x . w) (Qwen2-MoE); 0: none.
    shared_expert_intermediate_size: int = 0

    # Gemma 4: the full-attention layers' own head size and KV heads
    # (global_head_dim, num_global_key_value_heads); None: as the others.
    full_head_dim: int | None = None
    full_num_key_value_heads: int | None = None
    # The last this many layers compute no K/V: each attends over the cache
    # of the last earlier layer of its kind (Gemma 4's num_kv_shared_layers).
    num_kv_shared_layers: int = 0
    # Full-attention layers take V from k_proj's output (Gemma 4's attention_k_eq_v).
    full_attention_k_eq_v: bool = False
    # V heads get an RMSNorm without weight before the cache (Gemma 4).
    v_norm: bool = False
    # Per-layer embeddings (Gemma 4's PLE; sluice/models/gemma4.py): the width
    # each layer gets and the vocabulary of their table; 0: none.
    per_layer_input_size: int = 0
    per_layer_vocab_size: int = 0
    # The KV-shared layers' MLP is twice intermediate_size (use_double_wide_mlp).
    double_wide_shared_mlp: bool = False

    def __post_init__(self) -> None:
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)

    @property
    def has_partial_rotary(self) -> bool:
        """RoPE leaves some dims of each head unrotated (Phi-4-mini)."""
        return self.rotary_dim != self.head_dim

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_moe_layer(self, index: int) -> bool:
        """Layer `index`'s MLP is a mixture of experts."""
        return self.num_experts > 0 and index not in self.dense_mlp_layers

    @property
    def has_sequence_state(self) -> bool:
        """Some layers carry a per-sequence state beside the KV cache (hybrids)."""
        return any(kind in (CONV, LINEAR, MAMBA) for kind in self.layer_types)

    def layer_kv_shape(self, index: int) -> tuple[int, int]:
        """(KV heads, head size) of layer `index`'s attention."""
        if self.full_head_dim is not None and self.layer_types and self.layer_types[index] == FULL:
            return self.full_num_key_value_heads or self.num_key_value_heads, self.full_head_dim
        return self.num_key_value_heads, self.head_dim

    def kv_source_layer(self, index: int) -> int:
        """The layer whose KV cache layer `index` attends over: itself, or for
        a KV-shared layer the last earlier unshared layer of its kind."""
        first_shared = self.num_hidden_layers - self.num_kv_shared_layers
        if index < first_shared:
            return index
        kinds = self.layer_types or (FULL,) * self.num_hidden_layers
        sources = [i for i in range(first_shared) if kinds[i] == kinds[index]]
        assert sources, f"no unshared {kinds[index]} layer before shared layer {index}"
        return sources[-1]

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one KV head."""
        return self.num_attention_heads // self.num_key_value_heads
