"""GGUF -> cached HF folder: contents, exact weights, cache hits, atomicity, corrupt files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import gguf_convert, load_model
from sluice.loader.gguf_convert import cache_folder_for, converted_folder
from sluice.loader.sources import embedded_gguf_path
from sluice.models.attention import AttentionMetadata, allocate_kv_caches
from sluice.tokenizer import Tokenizer
from tests.gguf_files import write_tiny_gguf
from tests.model_factory import TinyModel, build_tiny_model


@pytest.fixture(scope="module", params=["llama_tied", "mistral", "llama3_untied"])
def tiny(request, tmp_path_factory) -> TinyModel:
    return build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture
def tiny_gguf(tiny, tmp_path) -> Path:
    return write_tiny_gguf(tiny, tmp_path / "Tiny.F32.gguf")


def test_embedded_conversion_writes_a_complete_hf_folder(embedded_model_dir):
    names = {p.name for p in embedded_model_dir.iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "sluice_source.json",
    }
    config = json.loads((embedded_model_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 30
    with safe_open(str(embedded_model_dir / "model.safetensors"), framework="pt") as weights:
        slices = {name: weights.get_slice(name) for name in weights.keys()}  # noqa: SIM118
    assert len(slices) == 2 + 30 * 9  # embedding, final norm, nine per layer; tied head
    assert slices["model.layers.0.self_attn.k_proj.weight"].get_shape() == [192, 576]
    assert {s.get_dtype() for s in slices.values()} == {"F32"}
    template = (embedded_model_dir / "chat_template.jinja").read_text()
    assert template.startswith("{% for message in messages %}")
    assert "You are a helpful AI assistant named SmolLM" in template


def test_a_second_conversion_is_a_cache_hit(embedded_model_dir, monkeypatch):
    def fail(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "write_hf_folder", fail)
    # A hit is found from the file's content digest, remembered under its
    # path, size, mtime and inode (loader/model_cache.py): the GGUF is never parsed.
    monkeypatch.setattr(gguf_convert, "GGUFReader", fail)
    folder = converted_folder(embedded_gguf_path(), embedded_model_dir.parent)
    assert folder == embedded_model_dir


def test_tiny_gguf_converts_back_to_the_exact_hf_weights(tiny, tiny_gguf, tmp_path):
    folder = converted_folder(tiny_gguf, tmp_path / "cache")
    ours = load_file(folder / "model.safetensors")
    original = dict(tiny.weights())
    assert ours.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(ours[name], tensor), name


def test_a_model_past_the_shard_size_is_written_in_several_files_that_load_whole(
    tiny, tiny_gguf, tmp_path, monkeypatch
):
    """The conversion holds one shard of float32 weights at a time, not the model."""
    monkeypatch.setattr(gguf_convert, "SHARD_BYTES", 64 * 1024)
    folder = converted_folder(tiny_gguf, tmp_path / "cache")
    shards = sorted(folder.glob("*.safetensors"))
    later = {f"model-{number:05d}.safetensors" for number in range(2, len(shards) + 1)}
    assert len(shards) > 2 and {shard.name for shard in shards} == {"model.safetensors", *later}
    ours = {name: t for shard in shards for name, t in load_file(shard).items()}
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert index["weight_map"].keys() == ours.keys()
    original = dict(tiny.weights())
    assert ours.keys() == original.keys()
    assert all(torch.equal(ours[name], tensor) for name, tensor in original.items())
    config = ModelConfig(
        model=str(tiny_gguf), cache_dir=tmp_path / "cache", dtype="float32", quantization=None
    )
    assert load_model(config).model.is_loaded


def test_tiny_gguf_tokenizer_and_chat_template_survive_conversion(tiny_gguf, tmp_path):
    tokenizer = Tokenizer.from_folder(converted_folder(tiny_gguf, tmp_path / "cache"))
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_ids == {2}
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<s>user: hi</s>"


def test_load_model_runs_a_gguf_file_like_transformers_runs_the_original(tiny, tiny_gguf, tmp_path):
    config = ModelConfig(
        model=str(tiny_gguf), cache_dir=tmp_path / "cache", dtype="float32", quantization=None
    )
    loaded = load_model(config)
    assert loaded.name == "Tiny"
    prompt = [5, 17, 42, 99, 300]
    kv_caches = allocate_kv_caches(loaded.model_config, 1, 16, torch.float32, "cpu")
    attn = AttentionMetadata.build([len(prompt)], [0], [[0]], 16, "cpu")
    with torch.no_grad():
        hidden = loaded.model(torch.tensor(prompt), torch.arange(len(prompt)), kv_caches, attn)
        ours = loaded.model.compute_logits(hidden)  # [5, vocab]
        reference = tiny.hf_model(torch.tensor([prompt])).logits[0]  # [5, vocab]
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


def test_a_changed_gguf_gets_a_new_cache_folder_and_a_touched_one_keeps_its_own(
    tiny_gguf, tmp_path
):
    before = cache_folder_for(tiny_gguf, tmp_path)
    stat = tiny_gguf.stat()
    os.utime(tiny_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert cache_folder_for(tiny_gguf, tmp_path) == before  # same bytes
    data = bytearray(tiny_gguf.read_bytes())
    data[-1] ^= 1
    tiny_gguf.write_bytes(bytes(data))
    assert cache_folder_for(tiny_gguf, tmp_path) != before


def model_folders(cache_dir: Path) -> list[str]:
    """What a cache holds besides the content digests' memo."""
    return [p.name for p in cache_dir.iterdir() if p.name != "content"]


def test_a_failed_conversion_leaves_nothing_behind(tiny_gguf, tmp_path, monkeypatch):
    def broken_tokenizer(gguf_path, folder):
        raise ModelLoadError("tokenizer exploded")

    monkeypatch.setattr(gguf_convert, "_write_tokenizer", broken_tokenizer)
    cache_dir = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="tokenizer exploded"):
        converted_folder(tiny_gguf, cache_dir)
    assert model_folders(cache_dir) == []


def test_a_conversion_finished_first_by_another_process_is_reused(tiny_gguf, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    real_write = gguf_convert.write_hf_folder

    def racing_write(gguf_path, temp, with_weights=True):
        # The other process publishes its complete folder while we are still writing.
        other = cache_folder_for(gguf_path, cache_dir)
        other.mkdir()
        (other / "config.json").write_text("{}")
        real_write(gguf_path, temp)

    monkeypatch.setattr(gguf_convert, "write_hf_folder", racing_write)
    folder = converted_folder(tiny_gguf, cache_dir)
    assert model_folders(cache_dir) == [folder.name]
    assert (folder / "config.json").read_text() == "{}"


def test_a_file_that_is_not_gguf_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="corrupt GGUF file") as info:
        converted_folder(path, tmp_path / "cache")
    assert "\n" not in str(info.value)
    assert model_folders(tmp_path / "cache") == []


def test_a_truncated_gguf_is_reported_as_corrupt(tiny_gguf, tmp_path):
    data = tiny_gguf.read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="corrupt GGUF file") as info:
        converted_folder(path, tmp_path / "cache")
    assert "\n" not in str(info.value)


_KILLED_CONVERSION = """
import sys, time
from pathlib import Path
from sluice.loader import gguf_convert

def endless_write(gguf_path, folder, with_weights=True):
    (folder / "model.safetensors").write_bytes(b"x" * 4096)
    print("writing", flush=True)
    time.sleep(600)

gguf_convert.write_hf_folder = endless_write
gguf_convert.converted_folder(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_a_killed_conversions_temporary_folder_is_removed_by_the_next_start(tiny_gguf, tmp_path):
    cache_dir = tmp_path / "cache"
    killed = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CONVERSION, str(tiny_gguf), str(cache_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert killed.stdout.readline().strip() == "writing"
    killed.kill()
    killed.wait()
    (left,) = model_folders(cache_dir)
    assert (cache_dir / left / "model.safetensors").is_file()
    folder = converted_folder(tiny_gguf, cache_dir)
    assert model_folders(cache_dir) == [folder.name]


def _temp_named(cache_dir: Path, owner: str, age_s: float = 0.0) -> Path:
    temp = cache_dir / f".model-0123456789abcdef.{owner}abcd_123"
    temp.mkdir(parents=True)
    if age_s:
        then_s = time.time() - age_s
        os.utime(temp, (then_s, then_s))
    return temp


def test_only_temporary_folders_whose_owner_is_gone_or_that_are_too_old_are_removed(
    tiny_gguf, tmp_path
):
    cache_dir = tmp_path / "cache"
    host = gguf_convert.host_name()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    kept = [
        _temp_named(cache_dir / "a", f"{host}-{os.getpid()}."),  # converting right now
        _temp_named(cache_dir / "b", "elsewhere-12."),  # another machine's, recent
        _temp_named(cache_dir / "c", ""),  # an older sluice's, recent
    ]
    removed = [
        _temp_named(cache_dir / "d", f"{host}-{gone.stdout.strip()}."),
        _temp_named(cache_dir / "e", "elsewhere-12.", age_s=gguf_convert.STALE_TEMP_AGE_S + 60),
        _temp_named(cache_dir / "f", "", age_s=gguf_convert.STALE_TEMP_AGE_S + 60),
    ]
    unrelated = cache_dir / "g" / ".not-a-conversion"
    unrelated.mkdir(parents=True)
    for sub in "abcdefg":
        gguf_convert.remove_stale_temps(cache_dir / sub)
    assert all(temp.is_dir() for temp in kept)
    assert not any(temp.exists() for temp in removed)
    assert unrelated.is_dir()
