"""Model loading: embedded GGUF, HF folder or .gguf file -> weights + tokenizer.

Re-exports lazily (`sluice.lazy_exports`): the loader's modules import each
other, never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.loader.loaded_model import LoadedModel, load_model, resolve_max_model_len
    from sluice.loader.sources import ModelSource, resolve_source

__all__ = ["LoadedModel", "ModelSource", "load_model", "resolve_max_model_len", "resolve_source"]
__getattr__ = lazy_exports(
    __name__,
    {
        "LoadedModel": "sluice.loader.loaded_model",
        "load_model": "sluice.loader.loaded_model",
        "resolve_max_model_len": "sluice.loader.loaded_model",
        "ModelSource": "sluice.loader.sources",
        "resolve_source": "sluice.loader.sources",
    },
)
