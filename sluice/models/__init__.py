"""Our Llama-family model code and paged attention."""

from sluice.models.attention import (
    AttentionMetadata,
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    paged_attention,
)
from sluice.models.config import LlamaConfig, UnsupportedRopeScalingError
from sluice.models.llama import LlamaForCausalLM

__all__ = [
    "AttentionMetadata",
    "LlamaConfig",
    "LlamaForCausalLM",
    "UnsupportedRopeScalingError",
    "allocate_kv_caches",
    "kv_cache_bytes_per_block",
    "paged_attention",
]
