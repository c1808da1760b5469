"""Fixtures shared by test modules: the embedded model, converted once; a tiny
random Llama, loaded as the engine loads a model.

Converting the embedded GGUF (dequantize + build the fast tokenizer) takes
seconds, so one test session pays for it once, into a cache folder under
pytest's temporary directory. The tiny model is built once per module that
asks for it (tests/model_factory.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sluice.config import ModelConfig
from sluice.loader.gguf_convert import converted_folder
from sluice.loader.sources import embedded_gguf_path
from sluice.tokenizer import Tokenizer

if TYPE_CHECKING:
    from sluice.loader.loaded_model import LoadedModel
    from tests.model_factory import TinyModel


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


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A tiny random Llama (tied embeddings) as a Hugging Face folder."""
    # Imported here, as in the next fixture: torch and transformers take seconds
    # to import, and most test modules never ask for a model.
    from tests.model_factory import build_tiny_model

    return build_tiny_model("llama_tied", tmp_path_factory.mktemp("tiny-engine"))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level tokenizer: a model folder `sluice serve` loads."""
    from tests.model_factory import build_tiny_model, write_tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny-folder") / "tiny-llama"
    build_tiny_model("llama_tied", folder)
    write_tiny_tokenizer(folder, num_tokens=512)  # every id the model can sample
    return folder


@pytest.fixture(scope="module")
def tiny_loaded(tiny_llama: TinyModel) -> LoadedModel:
    """`tiny_llama` loaded for the engine: float32 on the CPU, no tokenizer."""
    import torch

    from sluice.loader.choices import ModelChoices
    from sluice.loader.loaded_model import LoadedModel
    from sluice.models.families.registry import parse_hf_config
    from sluice.models.llama import LlamaForCausalLM

    model_config = parse_hf_config(tiny_llama.config_dict)
    model = LlamaForCausalLM(model_config, torch.float32, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    return LoadedModel(
        model=model,
        tokenizer=None,
        model_config=model_config,
        max_model_len=model_config.max_position_embeddings,
        name="tiny",
        eos_token_ids=frozenset({2}),
        folder=tiny_llama.path,
        choices=ModelChoices("float32", None, "as asked"),
    )
