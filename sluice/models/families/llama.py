"""Llama 2/3 (SmolLM2 too) and Mistral: the decoder as sluice/models/llama.py
runs it, SwiGLU without bias, q/k/v and o_proj biased together when
`attention_bias`, a sliding window only where it covers the whole context."""

from __future__ import annotations

from typing import Any

from sluice.models.decoder_config import DecoderConfig
from sluice.models.families.family import Family, GgufFamily
from sluice.models.families.hf_fields import check_swiglu, common_fields, full_context_window
from sluice.models.llama import LlamaForCausalLM


def parse_llama(d: dict[str, Any], architecture: str = "LlamaForCausalLM") -> DecoderConfig:
    check_swiglu(d)
    fields = common_fields(d, architecture)
    fields["sliding_window"] = full_context_window(d, fields["max_position_embeddings"])
    return DecoderConfig(**fields)


def parse_mistral(d: dict[str, Any]) -> DecoderConfig:
    return parse_llama(d, "MistralForCausalLM")


LLAMA = Family(
    architecture="LlamaForCausalLM",
    model_type="llama",
    parse_config=parse_llama,
    model_class=LlamaForCausalLM,
    # llama.cpp writes Mistral as llama too.
    gguf=GgufFamily("llama", permutes_qk=True),
)
MISTRAL = Family("MistralForCausalLM", "mistral", parse_mistral, LlamaForCausalLM)
FAMILIES = (LLAMA, MISTRAL)
