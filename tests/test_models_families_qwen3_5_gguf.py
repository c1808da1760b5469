"""A Qwen3.5 GGUF as llama.cpp's own converter writes it (families/qwen3_5.py):
a tiny random Qwen3.5 (2 key heads over 4 value heads, so the converter
reorders the value heads) through the vendored convert_hf_to_gguf.py, then
read back: the HF folder's config, every tensor in the HF layout (the
renamed, squeezed, reordered and shifted ones restored; A_log to the float32
that gives the file's A), logits bit for bit and greedy tokens equal to the
HF folder's load, and transformers' within float32 rounding."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from safetensors.numpy import load_file

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import gguf_llama
from sluice.loader.gguf_tensors import gguf_weights
from sluice.loader.loaded_model import load_model
from sluice.models.families.family import a_log_from_a
from sluice.models.families.registry import parse_hf_config
from tests.invariance_runs import random_prompt
from tests.llama_cpp_converter import convert, require_converter
from tests.model_factory import QWEN3_5_KIND, TinyModel, build_tiny_model, write_tiny_tokenizer
from tests.model_runs import PagedRunner, assert_close_to_scale, greedy, hf_logits, prompt_logits

PROMPT = [1, 17, 300, 45, 9, 88, 211, 5, 402, 77, 3, 150, 64, 33, 19, 260, 7]
CONVERTER_CLASS = "conversion.qwen:Qwen3_5TextModel"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[TinyModel, Path]:
    require_converter()
    directory = tmp_path_factory.mktemp("qwen35_gguf")
    tiny = build_tiny_model(QWEN3_5_KIND, directory / "hf")
    write_tiny_tokenizer(directory / "hf", num_tokens=512)
    # --no-mtp: the tiny checkpoint has no multi-token-prediction layer.
    path = convert(directory / "hf", directory / "tiny.gguf", CONVERTER_CLASS, "--no-mtp")
    return tiny, path


def load(path: Path, tmp_path: Path):
    config = ModelConfig(
        model=str(path), cache_dir=tmp_path / "cache", dtype="float32", quantization=None
    )
    return load_model(config)


def test_the_converters_metadata_gives_the_hf_folders_config(converted):
    tiny, path = converted
    reader = GGUFReader(path)
    assert gguf_llama.field_value(reader, "general.architecture") == "qwen35"
    ours = parse_hf_config(gguf_llama.hf_config(reader))
    theirs = parse_hf_config(tiny.config_dict)
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)  # float32 in GGUF
    assert dataclasses.replace(ours, rms_norm_eps=theirs.rms_norm_eps) == theirs


def test_every_tensor_comes_back_in_the_hf_layout(converted):
    """Names and shapes all HF's; values bit for bit but where the converter
    rounded: norms stored as 1 + weight (the 1 comes off exactly, so 1 + weight
    is the file's again) and A_log (its exp is the file's A)."""
    tiny, path = converted
    reader = GGUFReader(path)
    tensors = dict(gguf_llama.hf_tensors(reader, gguf_llama.hf_config(reader)))
    state = load_file(str(tiny.path / "model.safetensors"))
    assert set(tensors) == set(state)
    for name, want in state.items():
        got = tensors[name]
        assert got.shape == want.shape, name
        if name.endswith(".A_log"):
            assert torch.equal(torch.from_numpy(got).exp(), torch.from_numpy(want).exp()), name
        elif name.endswith("norm.weight") and ".linear_attn." not in name:
            np.testing.assert_array_equal(got + np.float32(1), want + np.float32(1), err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_the_value_heads_reordering_is_undone(converted):
    """The converter tiled the 4 value heads over the 2 key heads (0, 2, 1, 3):
    the file's rows differ from the checkpoint's, and come back."""
    tiny, path = converted
    reader = GGUFReader(path)
    (stored,) = [t for t in reader.tensors if t.name == "blk.0.ssm_beta.weight"]
    want = load_file(str(tiny.path / "model.safetensors"))[
        "model.layers.0.linear_attn.in_proj_b.weight"
    ]
    rows = np.asarray(stored.data).reshape(want.shape)
    np.testing.assert_array_equal(rows, want[[0, 2, 1, 3]])


def test_logits_and_greedy_tokens_equal_the_hf_folders(converted, tmp_path):
    tiny, path = converted
    from_gguf, from_folder = load(path, tmp_path), load(tiny.path, tmp_path)
    prompt = random_prompt(random.Random(0), 40)
    ours = prompt_logits(from_gguf.model, prompt)
    torch.testing.assert_close(ours, prompt_logits(from_folder.model, prompt), rtol=0, atol=0)
    tokens = greedy(PagedRunner(from_gguf.model), PROMPT, 16)
    assert tokens == greedy(PagedRunner(from_folder.model), PROMPT, 16)
    assert_close_to_scale(ours, hf_logits(tiny, prompt), 1e-5)


def test_the_kept_block_path_reads_the_same_tensors(converted):
    """`--quantization gguf`'s reader yields the restored tensors too."""
    _, path = converted
    reader = GGUFReader(path)
    config = gguf_llama.hf_config(reader)
    blocks = dict(gguf_weights(reader, config))
    for name, want in gguf_llama.hf_tensors(reader, config):
        assert torch.equal(blocks[name], torch.from_numpy(want.copy())), name


def test_a_float32_search_gives_back_each_as_exp():
    a_log = torch.tensor([-3.0, -0.1, 0.0, 0.7, 2.5, 2.77], dtype=torch.float32)
    a = -a_log.exp()
    restored = torch.from_numpy(a_log_from_a(a.numpy()))
    assert torch.equal(-restored.exp(), a)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qwen35.ssm.inner_size": 30}, "ssm.inner_size 30 is not a multiple of ssm.time_step_rank 4"),
        ({"general.architecture": "qwen35moe"}, "unsupported GGUF architecture 'qwen35moe'"),
    ],
)  # fmt: skip
def test_an_unsupported_variant_is_refused_in_one_line(converted, change, message):
    _, path = converted
    reader = GGUFReader(path)
    original = gguf_llama.field_value

    def field_value(reader, key, default=None):
        return change[key] if key in change else original(reader, key, default)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_llama, "field_value", field_value)
        with pytest.raises(ModelLoadError, match=message) as raised:
            gguf_llama.hf_config(reader)
    assert "\n" not in str(raised.value)


def test_a_multi_token_prediction_layer_counted_among_the_blocks_is_left_out(converted, tmp_path):
    """Qwen3.5 checkpoints declare one MTP layer: the converter counts it in
    block_count (nextn_predict_layers 1); the decoder keeps its 4 layers."""
    tiny, _ = converted
    folder = tmp_path / "mtp"
    shutil.copytree(tiny.path, folder)
    config = json.loads((folder / "config.json").read_text()) | {"mtp_num_hidden_layers": 1}
    (folder / "config.json").write_text(json.dumps(config))
    reader = GGUFReader(convert(folder, tmp_path / "mtp.gguf", CONVERTER_CLASS))
    assert gguf_llama.field_value(reader, "qwen35.block_count") == 5
    hf = gguf_llama.hf_config(reader)
    assert parse_hf_config(hf).layer_types == parse_hf_config(tiny.config_dict).layer_types
    assert {name for name, _ in gguf_llama.hf_tensors(reader, hf)} == set(
        load_file(str(tiny.path / "model.safetensors"))
    )
