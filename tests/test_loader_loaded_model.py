"""load_model end to end: HF folders (single and sharded), the embedded model,
max_model_len, and a one-line ModelLoadError for every way loading can fail."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sluice.config import ConfigError, ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import LoadedModel, gguf_convert, load_model
from sluice.loader.weights import INDEX_FILE
from sluice.models.attention import AttentionMetadata, allocate_kv_caches
from tests.model_factory import build_tiny_model, write_tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny random llama (tied) with a tokenizer: a complete HF folder."""
    folder = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    build_tiny_model("llama_tied", folder)
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture
def model_dir(tiny_folder, tmp_path) -> Path:
    """A private copy of the tiny folder that a test may break."""
    return Path(shutil.copytree(tiny_folder, tmp_path / "tiny-llama"))


def load(folder: Path, **overrides) -> LoadedModel:
    return load_model(
        ModelConfig(
            model=str(folder),
            cache_dir=folder.parent / "cache",
            **({"dtype": "float32", "quantization": None} | overrides),
        )
    )


def shard(folder: Path) -> None:
    """Replace model.safetensors by two shards and their index."""
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :]), start=1):
        file_name = f"model-0000{i}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, folder / file_name)
        weight_map.update(dict.fromkeys(part, file_name))
    (folder / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))


def assert_fails(folder: Path, match: str, **overrides) -> None:
    with pytest.raises(ModelLoadError, match=match) as info:
        load(folder, **overrides)
    assert "\n" not in str(info.value)


def prompt_logits(loaded: LoadedModel, prompt: list[int]) -> torch.Tensor:  # [len(prompt), vocab]
    kv_caches = allocate_kv_caches(loaded.model_config, 1, 16, torch.float32, "cpu")
    attn = AttentionMetadata.build([len(prompt)], [0], [[0]], 16, "cpu")
    with torch.no_grad():
        hidden = loaded.model(torch.tensor(prompt), torch.arange(len(prompt)), kv_caches, attn)
        return loaded.model.compute_logits(hidden)


def test_an_hf_folder_loads_with_its_name_limit_eos_and_tokenizer(model_dir):
    loaded = load(model_dir)
    assert loaded.name == "tiny-llama"
    assert loaded.folder == model_dir.resolve()
    assert loaded.max_model_len == 256
    assert loaded.eos_token_ids == {2}
    assert loaded.model_config.num_hidden_layers == 2
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("héllo")) == "héllo"


def test_the_startup_reason_names_the_family_the_weights_memory_and_the_load_time(model_dir):
    loaded = load(model_dir)
    model = loaded.model
    # float32, not prepacked: every parameter once (the tied head shares the
    # embedding) plus the two RoPE tables.
    expected = sum(p.numel() * 4 for p in model.parameters())
    expected += (model.rope_cos.numel() + model.rope_sin.numel()) * model.rope_cos.element_size()
    assert model.weight_bytes() == expected
    reason = loaded.choices.reason
    assert "architecture LlamaForCausalLM: every engine path" in reason
    assert re.search(rf"weights {expected / 2**20:.0f} MiB in memory, loaded in \d+\.\d s$", reason)


def test_the_eos_ids_are_the_tokenizers_one_reading_of_every_config(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"eos_token_id": [2, 5]}))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    loaded = load(model_dir)
    assert loaded.eos_token_ids == loaded.tokenizer.eos_token_ids == {2, 5, 7}


def test_a_sharded_checkpoint_loads_the_same_model_as_one_file(tiny_folder, model_dir):
    shard(model_dir)
    assert not (model_dir / "model.safetensors").exists()
    prompt = [3, 50, 7, 200]
    sharded = prompt_logits(load(model_dir), prompt)
    single = prompt_logits(load(tiny_folder), prompt)
    assert torch.equal(sharded, single)


def test_bfloat16_weights_are_cast_on_load(model_dir):
    loaded = load(model_dir, dtype="bfloat16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_a_smaller_max_model_len_caps_the_model(model_dir):
    assert load(model_dir, max_model_len=100).max_model_len == 100


def test_a_max_model_len_beyond_the_model_is_refused(model_dir):
    assert_fails(
        model_dir, "max_model_len 512 exceeds .* max_position_embeddings 256", max_model_len=512
    )


def test_a_non_positive_max_model_len_is_refused_by_the_config_before_loading():
    with pytest.raises(ConfigError, match="ModelConfig.max_model_len must be at least 1, got 0"):
        ModelConfig(max_model_len=0)


@pytest.mark.slow
def test_the_embedded_model_loads_from_the_cache_without_converting(
    embedded_model_config, monkeypatch
):
    def fail(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "write_hf_folder", fail)
    loaded = load_model(embedded_model_config)
    assert loaded.name == "SmolLM2-135M-Instruct"
    assert loaded.max_model_len == 8192
    assert loaded.eos_token_ids == {2}
    assert loaded.tokenizer.has_chat_template


def test_a_missing_path_is_refused(tmp_path):
    assert_fails(tmp_path / "nowhere", "model path does not exist")


def test_an_unsupported_architecture_is_refused(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (model_dir / "config.json").write_text(json.dumps(config))
    assert_fails(model_dir, "unsupported architecture GPT2LMHeadModel")


def test_a_folder_without_config_json_is_refused(model_dir):
    (model_dir / "config.json").unlink()
    assert_fails(model_dir, "no config.json in")


def test_a_broken_config_json_is_refused(model_dir):
    (model_dir / "config.json").write_text("{broken")
    assert_fails(model_dir, "unreadable config.json in")


def test_a_folder_without_weights_is_refused(model_dir):
    (model_dir / "model.safetensors").unlink()
    assert_fails(model_dir, r"no \*\.safetensors weights in")


def test_a_missing_shard_is_named(model_dir):
    shard(model_dir)
    (model_dir / "model-00001-of-00002.safetensors").unlink()
    assert_fails(model_dir, "shard model-00001-of-00002.safetensors named in")


def test_a_folder_without_a_tokenizer_is_refused(model_dir):
    (model_dir / "tokenizer.json").unlink()
    assert_fails(model_dir, "no tokenizer.json in")


def test_a_tokenizer_larger_than_the_model_vocab_is_refused(model_dir):
    write_tiny_tokenizer(model_dir, num_tokens=600)
    assert_fails(model_dir, "tokenizer has 600 tokens but the model's vocab_size is 512")


def test_a_corrupt_gguf_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 64)
    assert_fails(path, "corrupt GGUF file")


def test_an_unknown_dtype_is_refused(model_dir):
    assert_fails(model_dir, "unsupported dtype 'float8'", dtype="float8")
