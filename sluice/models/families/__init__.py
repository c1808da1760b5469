"""Model families: one module per family, collected by `registry.py`.

Re-exports lazily (`sluice.lazy_exports`): the family modules import each
other's public helpers (family.py, hf_fields.py), never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.models.families.family import Family, GgufFamily
    from sluice.models.families.registry import (
        SUPPORTED_ARCHITECTURES,
        build_model,
        describe_family,
        family_of,
        gguf_family,
        parse_hf_config,
    )

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "Family",
    "GgufFamily",
    "build_model",
    "describe_family",
    "family_of",
    "gguf_family",
    "parse_hf_config",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "Family": "sluice.models.families.family",
        "GgufFamily": "sluice.models.families.family",
        "SUPPORTED_ARCHITECTURES": "sluice.models.families.registry",
        "build_model": "sluice.models.families.registry",
        "describe_family": "sluice.models.families.registry",
        "family_of": "sluice.models.families.registry",
        "gguf_family": "sluice.models.families.registry",
        "parse_hf_config": "sluice.models.families.registry",
    },
)
