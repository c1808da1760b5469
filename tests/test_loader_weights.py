"""Safetensors checkpoints: single files, sharded index, and every missing-file error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sluice.errors import ModelLoadError
from sluice.loader.weights import INDEX_FILE, checkpoint_files, iter_weights


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        f"model.layers.{i}.mlp.up_proj.weight": torch.randn(4, 3, generator=generator)
        for i in range(4)
    }


def write_sharded(folder: Path, state: dict[str, torch.Tensor]) -> None:
    """Two shards plus the index that names them, as save_pretrained would write."""
    names = sorted(state)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    weight_map = {}
    for file_name, shard_names in shards.items():
        save_file({n: state[n] for n in shard_names}, folder / file_name)
        weight_map.update(dict.fromkeys(shard_names, file_name))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index))


def test_a_single_file_checkpoint_streams_every_tensor(tmp_path):
    state = tensors()
    save_file(state, tmp_path / "model.safetensors")
    files = checkpoint_files(tmp_path)
    assert files == [tmp_path / "model.safetensors"]
    loaded = dict(iter_weights(files))
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[name], state[name]) for name in state)


def test_a_sharded_checkpoint_streams_every_tensor_of_every_shard(tmp_path):
    state = tensors()
    write_sharded(tmp_path, state)
    files = checkpoint_files(tmp_path)
    assert [f.name for f in files] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    loaded = dict(iter_weights(files))
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[name], state[name]) for name in state)


def test_a_shard_named_in_the_index_but_missing_is_named(tmp_path):
    write_sharded(tmp_path, tensors())
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="shard model-00002-of-00002.safetensors named in"):
        checkpoint_files(tmp_path)


def test_an_unreadable_index_is_reported(tmp_path):
    (tmp_path / INDEX_FILE).write_text('{"no weight map": 1}')
    with pytest.raises(ModelLoadError, match=f"unreadable {INDEX_FILE}"):
        checkpoint_files(tmp_path)


def test_a_folder_without_safetensors_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights in"):
        checkpoint_files(tmp_path)


def test_pytorch_bin_weights_are_refused_with_a_reason(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="only PyTorch .bin/.pt files"):
        checkpoint_files(tmp_path)


def test_a_corrupt_safetensors_file_is_reported_in_one_line(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ModelLoadError, match="unreadable weights file") as info:
        list(iter_weights([path]))
    assert "\n" not in str(info.value)
