"""Session fixtures shared by test modules: the embedded model, converted once.

Converting the embedded GGUF (dequantize + build the fast tokenizer) takes
seconds, so one test session pays for it once, into a cache folder under
pytest's temporary directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import ModelConfig
from sluice.loader.gguf_convert import converted_folder
from sluice.loader.sources import embedded_gguf_path
from sluice.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def embedded_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's converted HF folder (config, safetensors, tokenizer)."""
    cache_dir = tmp_path_factory.mktemp("sluice-cache")
    return converted_folder(embedded_gguf_path(), cache_dir)


@pytest.fixture(scope="session")
def embedded_model_config(embedded_model_dir: Path) -> ModelConfig:
    """A ModelConfig for "embedded" whose cache already holds the conversion.

    float32 and unquantized, where greedy output is batch-invariant: the tests
    built on it compare runs that batch differently. The defaults ("auto")
    have tests of their own (test_loader_choices.py, test_quality_gate.py)."""
    return ModelConfig(cache_dir=embedded_model_dir.parent, dtype="float32", quantization=None)


@pytest.fixture(scope="session")
def embedded_tokenizer(embedded_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(embedded_model_dir)
