"""Model loading: embedded GGUF, HF folder or .gguf file -> weights + tokenizer."""

from sluice.loader.loaded_model import LoadedModel, load_model, resolve_max_model_len
from sluice.loader.sources import ModelSource, resolve_source

__all__ = ["LoadedModel", "ModelSource", "load_model", "resolve_max_model_len", "resolve_source"]
