"""The models `sluice serve` is asked to serve (sluice/server/served_models/model_catalog.py):
flags -> names, paths, estimated bytes and the pool's limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import cli
from sluice.config import CacheConfig, EngineConfig, ServerConfig
from sluice.errors import ModelLoadError
from sluice.server.served_models import model_catalog
from sluice.server.served_models.model_catalog import DEFAULT_KV_BYTES, model_specs, pool_limits

KV_BYTES = 1 << 20


def never_described(config):
    raise AssertionError("a spec is described by the pool, not by the catalog")


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """A models folder: two GGUF files, an HF folder, and things that are neither."""
    (tmp_path / "qwen2.5-0.5b-instruct.Q4_K_M.gguf").write_bytes(b"g" * 1000)
    (tmp_path / "SmolLM2-135M.gguf").write_bytes(b"g" * 300)
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 500)
    (folder / "tokenizer.json").write_text("{}")  # not weights
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "empty-folder").mkdir()
    return tmp_path


def serve_flags(*flags: str) -> ServerConfig:
    return cli.server_config_from(cli.build_parser().parse_args(["serve", *flags]))


def config(**fields) -> ServerConfig:
    engine = EngineConfig(cache=CacheConfig(kv_cache_memory_bytes=KV_BYTES))
    return ServerConfig(engine=engine, **fields)


def test_a_models_folder_serves_each_gguf_and_hf_folder_by_its_name(models):
    specs = model_specs(config(models_dir=models), never_described)
    assert [spec.name for spec in specs] == ["SmolLM2-135M", "qwen2.5-0.5b-instruct", "tiny-llama"]
    sizes = {spec.name: spec.estimated_bytes - KV_BYTES for spec in specs}
    assert sizes == {"SmolLM2-135M": 300, "qwen2.5-0.5b-instruct": 1000, "tiny-llama": 500}
    assert not any(spec.is_preloaded for spec in specs)  # several: each on first use
    assert model_specs(config(models_dir=models, preload=True), never_described)[0].is_preloaded


def test_models_given_by_flag_keep_their_order_and_name_equals_path_names_one(models):
    gguf = models / "SmolLM2-135M.gguf"
    folder = models / "tiny-llama"
    server = serve_flags("--model", str(gguf), "--model", f"small={folder}")
    assert server.models == (str(gguf), f"small={folder}")
    assert server.engine.model.model == str(gguf)  # the first is the engine's
    specs = model_specs(server, never_described)
    assert [spec.name for spec in specs] == ["SmolLM2-135M", "small"]
    assert specs[1].estimated_bytes == 500 + DEFAULT_KV_BYTES  # the CPU's default pool


def test_the_only_model_starts_with_the_server_and_takes_the_served_model_name(models):
    server = serve_flags("--model", str(models / "tiny-llama"), "--served-model-name", "tiny")
    (spec,) = model_specs(server, never_described)
    assert spec.name == "tiny" and spec.is_preloaded
    (default,) = model_specs(serve_flags(), never_described)
    assert default.name == "SmolLM2-135M-Instruct"  # the embedded model


def test_a_missing_path_or_two_models_of_one_name_fail_before_anything_loads(models):
    with pytest.raises(ModelLoadError, match="does not exist"):
        model_specs(config(models=("a", str(models / "nope.gguf"))), never_described)
    folder = str(models / "tiny-llama")
    with pytest.raises(ModelLoadError, match="two models are named 'tiny-llama'"):
        model_specs(config(models=(folder, folder)), never_described)
    with pytest.raises(ModelLoadError, match="not a folder"):
        model_specs(config(models_dir=models / "notes.txt"), never_described)
    with pytest.raises(ModelLoadError, match="no .gguf file or model folder"):
        model_specs(config(models_dir=models / "empty-folder"), never_described)


def test_the_several_models_flags_reach_the_pools_limits(monkeypatch):
    server = serve_flags("--models-max", "2", "--models-memory", "4GiB", "--preload")
    assert (server.models_max, server.models_memory_bytes, server.preload) == (2, 4 << 30, True)
    limits = pool_limits(server, gate_capacity=8)
    assert (limits.max_loaded, limits.memory_budget_bytes) == (2, 4 << 30)
    # No --models-memory: 90% of what the OS could give when the server starts.
    monkeypatch.setattr(model_catalog, "available_memory_bytes", lambda: 10_000)
    assert pool_limits(serve_flags(), gate_capacity=8).memory_budget_bytes == 9_000


def test_a_truncated_weights_file_fails_its_models_check_naming_the_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "tiny"
    folder.mkdir()
    save_file({"w": torch.zeros(256)}, str(folder / "model.safetensors"))
    model_catalog.check_weights(folder)  # whole: passes
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(ModelLoadError, match="model.safetensors.*not fully covered"):
        model_catalog.check_weights(folder)
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUX" + b"\x03\x00\x00\x00" + b"\xff" * 12)
    with pytest.raises(ModelLoadError, match="unreadable GGUF file .*broken.gguf"):
        model_catalog.check_weights(gguf)


def test_each_spec_checks_its_own_weights(models):
    specs = {spec.name: spec for spec in model_specs(config(models_dir=models), never_described)}
    with pytest.raises(ModelLoadError, match="tiny-llama/model.safetensors"):
        specs["tiny-llama"].check()
