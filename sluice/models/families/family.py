"""What the engine knows of one model family: `Family` and its `GgufFamily`.

A family module (`families/llama.py`, `qwen.py`, `phi3.py`, `gemma.py`)
declares one `Family` per HF architecture it runs; `families/registry.py`
collects them. Everything that differs between families is a field here or
a field of the `DecoderConfig` its parser returns, so no other module asks
which family a model is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sluice.models.decoder_config import DecoderConfig

if TYPE_CHECKING:
    from sluice.models.llama import LlamaForCausalLM

# One metadata value of the GGUF's architecture: meta("attention.sliding_window").
GgufMeta = Callable[..., Any]
# llama.cpp's per-head q/k norm stems, as Qwen3 and Gemma 3 store them.
QK_NORM_NAMES = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# How far from log(-A) the search for A_log's float32 goes, in ulps (a_log_from_a).
_SEARCH_ULPS = 8


@dataclass(frozen=True, slots=True)
class GgufFamily:
    """How one llama.cpp architecture maps onto its family's HF model
    (sluice/loader/gguf_llama.py reads it)."""

    # llama.cpp's name: the GGUF's `general.architecture` ("qwen3").
    architecture: str
    # llama.cpp interleaved the rotary halves of q/k rows (llama's rotation only).
    permutes_qk: bool
    # llama.cpp's converter added this to every norm weight (Gemma's 1 + weight).
    norm_shift: float = 0.0
    # Per-layer tensor stems beyond (or instead of) llama's.
    layer_names: dict[str, str] = field(default_factory=dict)
    # The config.json entries llama.cpp fixes in code rather than metadata:
    # (the config read so far, meta) -> entries to add; None: nothing more.
    config_entries: Callable[[dict[str, Any], GgufMeta], dict[str, Any]] | None = None
    # Tensor stems outside the layers beyond (or instead of) llama's: LFM2's
    # final norm is llama.cpp's `token_embd_norm`.
    global_names: dict[str, str] = field(default_factory=dict)
    # The architecture transformers' GGUF tokenizer converter reads the file's
    # vocabulary as, where it does not know llama.cpp's name (SmolLM3: "llama");
    # None: its own name (loader/gguf_tokenizer.py).
    tokenizer_architecture: str | None = None
    # Its expert stacks (`ffn_{gate,up,down}_exps`, weights and biases) load as
    # the stacked tensors of OpenAI's release, MXFP4 ones kept in 4 bits
    # (gpt-oss: loader/gguf_mxfp4.py); False: one matrix per expert (Qwen's).
    release_experts: bool = False
    # Token texts llama.cpp ends generation on beyond the file's eos (its
    # llama-vocab.cpp rule; gpt-oss's harmony: `<|return|>`, `<|call|>`): their
    # ids join the config's eos_token_id where the vocabulary has them.
    stop_tokens: tuple[str, ...] = ()
    # The converter's other changes to a tensor, undone: (HF name, the HF config)
    # -> a function of the tensor's float32 values in HF shape giving HF's values,
    # or None where it stored the tensor as HF holds it (Qwen3.5's `ssm_a` is
    # -exp(A_log), its V heads reordered). Such a tensor loads in float32 even
    # from a block type.
    restore: Callable[[str, dict[str, Any]], Callable[[np.ndarray], np.ndarray] | None] | None = (
        None
    )


@dataclass(frozen=True, slots=True)
class Family:
    """One HF architecture: how to read its config, which class runs it, how
    its GGUF is named, and which engine paths it may take."""

    # The HF name in config.json's "architectures" ("Qwen3ForCausalLM").
    architecture: str
    # config.json's "model_type", which older files name their family by.
    model_type: str
    # An HF config.json dict (this architecture's) -> the decoder's config;
    # ModelLoadError on what the model code cannot run.
    parse_config: Callable[[dict[str, Any]], DecoderConfig]
    # The model class that runs it (llama.py's decoder or a subclass).
    model_class: type[LlamaForCausalLM]
    # llama.cpp's names for it; None: no GGUF is read as this family.
    gguf: GgufFamily | None = None
    # RoPE may rotate part of each head (Phi-4-mini's partial_rotary_factor).
    partial_rotary: bool = False

    @property
    def supports_fused_decode(self) -> bool:
        """Its layers may run decode steps in one native call (fused_decode.py)."""
        return self.model_class.layer_class.supports_fused_decode


def a_log_from_a(a: np.ndarray) -> np.ndarray:
    """llama.cpp's converter stores a Mamba-style `ssm_a` = -exp(A_log) (Qwen3.5,
    Granite 4.0-H): the float32 A_log with -exp(A_log) == `a` exactly (torch's float32 exp,
    as the model takes it), searched within _SEARCH_ULPS of log(-a); the
    nearest where none is exact."""
    target = torch.from_numpy(np.ascontiguousarray(-a, dtype=np.float32))
    with np.errstate(divide="ignore", invalid="ignore"):
        start = np.log(-a.astype(np.float64)).astype(np.float32)
    best, best_error = start, np.full(a.shape, np.inf)
    for step in range(-_SEARCH_ULPS, _SEARCH_ULPS + 1):
        toward = np.float32(np.inf if step > 0 else -np.inf)
        candidate = start
        for _ in range(abs(step)):
            candidate = np.nextafter(candidate, toward)
        error = (torch.exp(torch.from_numpy(candidate)) - target).abs().double().numpy()
        better = error < best_error
        best, best_error = np.where(better, candidate, best), np.where(better, error, best_error)
    return best.astype(np.float32)
