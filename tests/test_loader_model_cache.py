"""The cache folder: keyed by content, bounded in bytes, listable and removable."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from sluice.cli import main
from sluice.errors import ModelLoadError
from sluice.loader import gguf_convert, model_cache
from sluice.loader.gguf_convert import converted_folder
from tests.gguf_files import write_tiny_gguf
from tests.model_factory import TinyModel, build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_model("llama_tied", tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def tiny_gguf(tiny, tmp_path) -> Path:
    return write_tiny_gguf(tiny, tmp_path / "Tiny.F32.gguf")


def _model_folder(cache_dir: Path, name: str, size_bytes: int, used_s_ago: float) -> Path:
    folder = cache_dir / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * size_bytes)
    then_s = time.time() - used_s_ago
    os.utime(folder, (then_s, then_s))
    return folder


def test_two_copies_of_one_gguf_share_one_converted_folder(tiny_gguf, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    first = converted_folder(tiny_gguf, cache_dir)
    elsewhere = tmp_path / "venv2" / tiny_gguf.name
    elsewhere.parent.mkdir()
    shutil.copy(tiny_gguf, elsewhere)

    def fail(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "write_hf_folder", fail)
    assert converted_folder(elsewhere, cache_dir) == first


def test_the_digest_is_the_files_sha256_and_is_remembered(tiny_gguf, tmp_path):
    import hashlib

    expected = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert model_cache.content_digest(tiny_gguf, tmp_path) == expected
    (memo,) = (tmp_path / model_cache.CONTENT_MEMO).iterdir()
    assert memo.read_text() == expected
    # Remembered under the file's identity: the same answer without reading it.
    tiny_gguf.chmod(0)
    try:
        assert model_cache.content_digest(tiny_gguf, tmp_path) == expected
    finally:
        tiny_gguf.chmod(0o644)


def test_prune_removes_the_least_recently_used_models_until_they_fit(tmp_path):
    old = _model_folder(tmp_path, "old-1", 4000, used_s_ago=300)
    middle = _model_folder(tmp_path, "middle-2", 4000, used_s_ago=200)
    new = _model_folder(tmp_path, "new-3", 4000, used_s_ago=100)
    support = tmp_path / "calibration"
    support.mkdir()
    (support / "plan.json").write_bytes(b"x" * 10_000)
    removed = model_cache.prune(tmp_path, max_bytes=8000)
    assert [entry.name for entry in removed] == ["old-1"]
    assert not old.exists() and middle.is_dir() and new.is_dir() and support.is_dir()


def test_prune_never_removes_the_folder_in_use_even_past_the_bound(tmp_path):
    in_use = _model_folder(tmp_path, "big-1", 9000, used_s_ago=300)
    other = _model_folder(tmp_path, "other-2", 100, used_s_ago=200)
    removed = model_cache.prune(tmp_path, max_bytes=1000, keep=in_use)
    assert [entry.name for entry in removed] == ["other-2"]
    assert in_use.is_dir() and not other.exists()


def test_a_conversion_prunes_older_models_past_the_bound(tiny_gguf, tmp_path):
    cache_dir = tmp_path / "cache"
    stale = _model_folder(cache_dir, "stale-0123456789abcdef", 1 << 20, used_s_ago=3600)
    folder = converted_folder(tiny_gguf, cache_dir, max_bytes=1 << 20)
    assert folder.is_dir()
    assert not stale.exists()


def test_a_cache_hit_marks_its_folder_used(tiny_gguf, tmp_path):
    cache_dir = tmp_path / "cache"
    folder = converted_folder(tiny_gguf, cache_dir)
    os.utime(folder, (1.0, 1.0))
    converted_folder(tiny_gguf, cache_dir)
    assert folder.stat().st_mtime > 1.0


def test_cache_list_rm_prune_and_clear_from_the_command_line(tmp_path, capsys):
    _model_folder(tmp_path, "alpha-1", 3000, used_s_ago=300)
    _model_folder(tmp_path, "beta-2", 3000, used_s_ago=200)
    _model_folder(tmp_path, "gamma-3", 3000, used_s_ago=100)
    assert main(["cache", "--cache-dir", str(tmp_path), "list"]) == 0
    listing = capsys.readouterr().out
    assert listing.index("alpha-1") < listing.index("beta-2") < listing.index("gamma-3")
    assert main(["cache", "--cache-dir", str(tmp_path), "rm", "beta-2"]) == 0
    assert "removed beta-2" in capsys.readouterr().out
    assert main(["cache", "--cache-dir", str(tmp_path), "prune", "--max-bytes", "4000"]) == 0
    assert "removed alpha-1" in capsys.readouterr().out
    assert main(["cache", "--cache-dir", str(tmp_path), "rm", "nope"]) == 2
    assert "no cache entry named nope" in capsys.readouterr().err
    assert main(["cache", "--cache-dir", str(tmp_path), "clear"]) == 0
    assert [p for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


def test_a_gguf_with_an_unsupported_tensor_type_is_refused_in_one_line(tiny, tmp_path, capsys):
    # IQ4_NL: blocks of 32 values, the tiny model's widths hold whole blocks.
    kind = "IQ4_NL"

    def kept(name: str) -> str | None:
        return kind if name.endswith("mlp.down_proj.weight") else None

    path = write_tiny_gguf(tiny, tmp_path / f"Tiny.{kind}.gguf", kept)
    cache_dir = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match=f"unsupported GGUF tensor type {kind} "):
        converted_folder(path, cache_dir)
    assert [p.name for p in cache_dir.iterdir()] == [model_cache.CONTENT_MEMO]
    argv = ["generate", "--model", str(path), "--cache-dir", str(cache_dir), "--prompt", "x"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ffn_down" in err and kind in err
