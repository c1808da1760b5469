"""Our decoder model code, its families and paged attention.

Re-exports lazily (`sluice.lazy_exports`): the model modules import each
other, never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.models.attention import (
        AttentionMetadata,
        allocate_kv_caches,
        kv_cache_bytes_per_block,
        paged_attention,
    )
    from sluice.models.decoder_config import DecoderConfig, UnsupportedRopeScalingError
    from sluice.models.llama import LlamaForCausalLM

__all__ = [
    "AttentionMetadata",
    "DecoderConfig",
    "LlamaForCausalLM",
    "UnsupportedRopeScalingError",
    "allocate_kv_caches",
    "kv_cache_bytes_per_block",
    "paged_attention",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "AttentionMetadata": "sluice.models.attention",
        "allocate_kv_caches": "sluice.models.attention",
        "kv_cache_bytes_per_block": "sluice.models.attention",
        "paged_attention": "sluice.models.attention",
        "DecoderConfig": "sluice.models.decoder_config",
        "UnsupportedRopeScalingError": "sluice.models.decoder_config",
        "LlamaForCausalLM": "sluice.models.llama",
    },
)
