"""`--quantization auto` keeps a GGUF's blocks from 512 MiB on, for the
architectures the block path serves, where the kernel runs and every decoder
matrix is in a block format; smaller or other files keep the int8 copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import ModelConfig
from sluice.loader import block_default, load_model
from sluice.loader.block_default import BLOCKS_FROM_BYTES, blocks_by_default
from sluice.models.mxfp4_experts import Mxfp4Experts
from sluice.models.native.qblock import qblock_available
from sluice.models.qblock_linear import QBlockLinear
from tests.gguf_files import write_tiny_gguf
from tests.gpt_oss_files import (
    LLAMA_CPP,
    build_tiny_gpt_oss,
    convert_with_llama_cpp,
    write_mxfp4_folder,
)
from tests.model_factory import build_tiny_model


def q4_k_m_mix(hf_name: str) -> str | None:
    if "v_proj" in hf_name or "down_proj" in hf_name:
        return "Q6_K"
    return "Q8_0" if "embed_tokens" in hf_name else "Q4_K"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    return build_tiny_model("llama_tied", folder / "hf", hidden_size=256, intermediate_size=512,
                            head_dim=64)  # fmt: skip


@pytest.fixture(scope="module")
def q4_file(tiny, tmp_path_factory):
    return write_tiny_gguf(tiny, tmp_path_factory.mktemp("q4") / "Tiny.Q4_K_M.gguf", q4_k_m_mix)


def test_a_file_below_the_bound_keeps_the_int8_copy(q4_file):
    assert q4_file.stat().st_size < BLOCKS_FROM_BYTES
    assert blocks_by_default(q4_file, kernel_runs=lambda: True) is None


def test_a_block_file_from_the_bound_on_keeps_its_blocks_and_says_why(q4_file):
    reason = blocks_by_default(q4_file, from_bytes=0, kernel_runs=lambda: True)
    assert reason is not None and "keeps its blocks" in reason


def test_without_the_kernel_auto_keeps_the_int8_copy(q4_file):
    assert blocks_by_default(q4_file, from_bytes=0, kernel_runs=lambda: False) is None


def test_float_matrices_keep_the_int8_copy(tiny, tmp_path):
    float_file = write_tiny_gguf(tiny, tmp_path / "Tiny.F32.gguf")
    assert blocks_by_default(float_file, from_bytes=0, kernel_runs=lambda: True) is None


def test_an_architecture_the_block_path_does_not_serve_keeps_the_int8_copy(q4_file, monkeypatch):
    monkeypatch.setattr(block_default, "BLOCK_ARCHITECTURES", frozenset({"qwen3"}))
    assert blocks_by_default(q4_file, from_bytes=0, kernel_runs=lambda: True) is None


def test_a_corrupt_file_is_left_to_the_load_to_name(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    assert blocks_by_default(bad, from_bytes=0, kernel_runs=lambda: True) is None


@pytest.mark.skipif(not qblock_available(), reason="needs the qblock kernel")
def test_the_load_at_auto_serves_a_large_enough_file_from_its_blocks(
    q4_file, tmp_path, monkeypatch
):
    monkeypatch.setattr(block_default, "BLOCKS_FROM_BYTES", 0)
    config = ModelConfig(model=str(q4_file), cache_dir=tmp_path, dtype="float32")
    loaded = load_model(config)
    assert isinstance(loaded.model.layers[0].qkv_proj, QBlockLinear)
    assert "keeps its blocks" in loaded.choices.reason
    assert "GGUF blocks kept" in loaded.choices.reason
    assert not list(tmp_path.rglob("*.safetensors"))


def test_the_server_process_reads_the_tokenizer_without_converting_weights(
    q4_file, tmp_path, monkeypatch
):
    """describe_model and the engine resolve auto the same way: a file that
    keeps its blocks is never converted to a float copy on disk."""
    from sluice.server.http.launch import describe_model

    monkeypatch.setattr(block_default, "BLOCKS_FROM_BYTES", 0)
    monkeypatch.setattr(block_default, "qblock_available", lambda: True)
    config = ModelConfig(model=str(q4_file), cache_dir=tmp_path, dtype="float32")
    assert describe_model(config).tokenizer is not None
    assert not list(tmp_path.rglob("*.safetensors"))


@pytest.fixture(scope="module")
def gpt_oss_files(tmp_path_factory) -> dict[str, Path]:
    """A tiny MXFP4 gpt-oss through llama.cpp's converter, as q8_0 and f32."""
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {LLAMA_CPP} (set SLUICE_LLAMA_CPP)")
    directory = tmp_path_factory.mktemp("gpt_oss")
    tiny = build_tiny_gpt_oss(directory / "float")
    write_mxfp4_folder(tiny, directory / "mxfp4")
    return {
        kind: convert_with_llama_cpp(directory / "mxfp4", directory / f"{kind}.gguf", kind)
        for kind in ("q8_0", "f32")
    }


def test_gpt_oss_keeps_its_blocks_with_mxfp4_experts_and_an_f32_router(gpt_oss_files):
    """The converter leaves each router F32 (as llama-quantize does) and the
    experts MXFP4: neither stops the blocks; F32 attention does."""
    reason = blocks_by_default(gpt_oss_files["q8_0"], from_bytes=0, kernel_runs=lambda: True)
    assert reason is not None and "keeps its blocks" in reason
    assert blocks_by_default(gpt_oss_files["f32"], from_bytes=0, kernel_runs=lambda: True) is None


@pytest.mark.skipif(not qblock_available(), reason="no AVX512-VNNI block kernels here")
def test_the_load_at_auto_serves_gpt_oss_from_its_blocks(gpt_oss_files, tmp_path, monkeypatch):
    monkeypatch.setattr(block_default, "BLOCKS_FROM_BYTES", 0)
    config = ModelConfig(model=str(gpt_oss_files["q8_0"]), cache_dir=tmp_path, dtype="float32")
    loaded = load_model(config)
    assert isinstance(loaded.model.layers[0].qkv_proj, QBlockLinear)
    assert isinstance(loaded.model.layers[0].moe.kept, Mxfp4Experts)
    assert not list(tmp_path.rglob("*.safetensors"))  # no float32 conversion written


@pytest.mark.skipif(not qblock_available(), reason="needs the qblock kernel")
def test_a_load_that_keeps_the_blocks_parses_the_gguf_header_once(q4_file, tmp_path, monkeypatch):
    """The decision (block_default) and the blocks read (gguf_weights) share one
    reader; the tokenizer folder was converted by an earlier start."""
    import gguf

    monkeypatch.setattr(block_default, "BLOCKS_FROM_BYTES", 0)
    config = ModelConfig(model=str(q4_file), cache_dir=tmp_path, dtype="float32")
    load_model(config)  # the first start writes the config and tokenizer folder
    opens = []
    real_init = gguf.GGUFReader.__init__

    def counting_init(self, *args, **kwargs):
        opens.append(args)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counting_init)
    load_model(config)
    assert len(opens) == 1


MiB = 2**20


@pytest.mark.parametrize(
    ("model_type", "four_bit_mib", "extra", "quantized"),
    [
        ("llama", 511, {}, False),  # the embedded 135M is ~75 MiB in 4 bits
        ("llama", 512, {}, True),
        ("llama", 663, {}, True),  # Llama 3.2 1B: 1.24 G values
        ("qwen2", 4_200, {}, True),
        ("qwen3", 600, {}, True),
        ("gemma3", 4_000, {}, False),  # not an architecture the block path serves
        ("llama", 4_000, {"quantization_config": {"quant_method": "gptq"}}, False),
    ],
)
def test_an_hf_checkpoint_follows_the_gguf_bound_by_its_size_in_4_bit_blocks(
    model_type, four_bit_mib, extra, quantized, tiny, tmp_path, monkeypatch
):
    import json
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(tiny.path, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type, **extra}))
    monkeypatch.setattr(block_default, "four_bit_bytes", lambda files: four_bit_mib * MiB)
    reason = block_default.hf_blocks_by_default(folder, kernel_runs=lambda: True)
    assert (reason is not None) == quantized
    if quantized:
        assert f"{four_bit_mib:,} MiB in 4-bit blocks" in reason and "Q4_K_M" in reason


def test_without_the_kernel_an_hf_checkpoint_keeps_the_int8_copy(tiny):
    assert (
        block_default.hf_blocks_by_default(tiny.path, from_bytes=0, kernel_runs=lambda: False)
        is None
    )


def test_an_hf_checkpoints_4_bit_size_is_its_values_at_4_5_bits(tiny):
    from sluice.loader.hf_blocks import four_bit_bytes, parameter_count

    values = sum(p.numel() for p in tiny.hf_model.parameters())
    assert parameter_count([tiny.path / "model.safetensors"]) == values
    assert four_bit_bytes([tiny.path / "model.safetensors"]) == values * 144 // 256


def test_auto_resolves_an_hf_checkpoint_to_q4_k_m_and_an_explicit_choice_wins(tiny, monkeypatch):
    from sluice.loader.sources import resolve_source

    monkeypatch.setattr(block_default, "BLOCKS_FROM_BYTES", 0)
    monkeypatch.setattr(block_default, "qblock_available", lambda: True)
    source = resolve_source(str(tiny.path))
    quantization, reason = block_default.resolve_quantization("auto", source)
    assert quantization == "q4_k_m" and reason is not None
    assert block_default.resolve_quantization("int8", source) == ("int8", None)
