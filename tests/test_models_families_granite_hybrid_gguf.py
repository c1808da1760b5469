"""A Granite 4.0-H GGUF as llama.cpp's own converter writes it
(families/granite_hybrid.py): tiny random Granite 4.0-H models, dense and
with 8 experts (tests/granite_files.py builds them), through the
vendored convert_hf_to_gguf.py in F32 and Q8_0, then read back: the HF
folder's config, every tensor in the HF layout (the fused input_linear as
its gate and up halves, A_log to the float32 that gives the file's A), the
F32 file's logits bit for bit the HF folder's and within float32 rounding of
transformers', greedy tokens through the engine equal to `generate`, the Q8_0
file's within its rounding; on the batch-invariant model, chunked prefill
and a prefix-cache hit give the cold run's tokens and logprobs bit for bit.
Skipped where the converter is absent (SLUICE_LLAMA_CPP)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from gguf import GGUFReader
from safetensors.numpy import load_file

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import gguf_llama
from sluice.loader.gguf_tensors import gguf_weights
from sluice.loader.loaded_model import LoadedModel, load_model
from sluice.models.families.registry import build_model, parse_hf_config
from tests.granite_files import DENSE, MOE, build_tiny_granite
from tests.invariance_runs import random_prompt
from tests.llama_cpp_converter import convert, require_converter
from tests.model_factory import TinyModel, make_core, write_tiny_tokenizer
from tests.model_runs import (
    GREEDY,
    assert_close_to_scale,
    hf_logits,
    prompt_logits,
    random_prompts,
    run,
    run_one_by_one,
)
from tests.speculation_runs import run as run_with_logprobs

CONVERTER_CLASS = "conversion.granite:GraniteHybridModel"
_LOGPROBS = msgspec.structs.replace(GREEDY, logprobs=2, max_tokens=8)


@dataclasses.dataclass(frozen=True)
class Converted:
    tiny: TinyModel
    f32: Path
    q8_0: Path


@pytest.fixture(scope="module", params=[DENSE, MOE])
def converted(request, tmp_path_factory) -> Converted:
    require_converter()
    directory = tmp_path_factory.mktemp(f"granite_gguf_{request.param}")
    tiny = build_tiny_granite(request.param, directory / "hf")
    write_tiny_tokenizer(directory / "hf", num_tokens=512)
    f32 = convert(directory / "hf", directory / "f32.gguf", CONVERTER_CLASS)
    q8_0 = convert(directory / "hf", directory / "q8_0.gguf", CONVERTER_CLASS, "--outtype", "q8_0")
    return Converted(tiny, f32, q8_0)


def load(path: Path, tmp_path: Path) -> LoadedModel:
    config = ModelConfig(
        model=str(path), cache_dir=tmp_path / "cache", dtype="float32", quantization=None
    )
    # The converter declares 2**20 tokens (no RoPE); the tiny runs need 256.
    return dataclasses.replace(load_model(config), max_model_len=256, eos_token_ids=frozenset({2}))


def test_the_converters_metadata_gives_the_hf_folders_config(converted):
    reader = GGUFReader(converted.f32)
    assert gguf_llama.field_value(reader, "general.architecture") == "granitehybrid"
    ours = parse_hf_config(gguf_llama.hf_config(reader))
    theirs = parse_hf_config(converted.tiny.config_dict)
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)  # float32 in GGUF
    assert ours.max_position_embeddings == 2**20  # the converter's, for a model without RoPE
    same = {"rms_norm_eps": theirs.rms_norm_eps, "max_position_embeddings": 256}
    assert dataclasses.replace(ours, **same) == theirs


def _hf_layout(tiny: TinyModel) -> dict[str, np.ndarray]:
    """The checkpoint's tensors, each fused input_linear as its gate and up halves."""
    state = {}
    for name, array in load_file(str(tiny.path / "model.safetensors")).items():
        if name.endswith(".input_linear.weight"):
            stem = name.removesuffix("input_linear.weight")
            state[stem + "gate_proj.weight"], state[stem + "up_proj.weight"] = np.split(
                array, 2, axis=-2
            )
        else:
            state[name] = array
    return state


def test_every_tensor_comes_back_in_the_hf_layout(converted):
    """Names and shapes HF's (input_linear split as the converter split it),
    values bit for bit; A_log's exp is the file's A."""
    reader = GGUFReader(converted.f32)
    tensors = dict(gguf_llama.hf_tensors(reader, gguf_llama.hf_config(reader)))
    state = _hf_layout(converted.tiny)
    assert set(tensors) == set(state)
    for name, want in state.items():
        got = tensors[name]
        assert got.shape == want.shape, name
        if name.endswith(".A_log"):
            assert torch.equal(torch.from_numpy(got).exp(), torch.from_numpy(want).exp()), name
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_the_kept_block_path_reads_the_same_tensors(converted):
    """`--quantization gguf`'s reader yields the restored tensors too."""
    reader = GGUFReader(converted.f32)
    config = gguf_llama.hf_config(reader)
    blocks = dict(gguf_weights(reader, config))
    for name, want in gguf_llama.hf_tensors(reader, config):
        assert torch.equal(blocks[name], torch.from_numpy(want.copy())), name


def test_f32_logits_are_the_hf_folders_bits_and_transformers_within_rounding(converted, tmp_path):
    from_gguf, from_folder = load(converted.f32, tmp_path), load(converted.tiny.path, tmp_path)
    prompt = random_prompt(random.Random(0), 40)
    ours = prompt_logits(from_gguf.model, prompt)
    torch.testing.assert_close(ours, prompt_logits(from_folder.model, prompt), rtol=0, atol=0)
    with torch.no_grad():
        assert_close_to_scale(ours, hf_logits(converted.tiny, prompt), 1e-5)


@pytest.mark.parametrize(("file", "tolerance"), [("f32", 1e-5), ("q8_0", 2e-2)])
def test_greedy_tokens_through_the_engine_match_transformers_generate(
    converted, tmp_path, file, tolerance
):
    """Q8_0's rounding moves the logits by well under 1% of their scale and
    no greedy token of these prompts."""
    loaded = load(getattr(converted, file), tmp_path)
    prompts = random_prompts(3, seed=7)
    with torch.no_grad():
        reference = hf_logits(converted.tiny, prompts[0])
    assert_close_to_scale(prompt_logits(loaded.model, prompts[0]), reference, tolerance)
    ours = run(make_core(loaded), prompts)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            generated = converted.tiny.hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24
            )[0]
        assert ours[i] == (generated[len(prompt) :].tolist(), "length")


@pytest.fixture
def invariant(converted, tmp_path) -> LoadedModel:
    """The Q8_0 file's model batch-invariant (fixed row tiles everywhere)."""
    loaded = load(converted.q8_0, tmp_path)
    model = build_model(loaded.model_config, torch.float32, torch.device("cpu"), True)
    reader = GGUFReader(converted.q8_0)
    tensors = gguf_llama.hf_tensors(reader, gguf_llama.hf_config(reader))
    model.load_weights((name, torch.from_numpy(array.copy())) for name, array in tensors)
    return dataclasses.replace(loaded, model=model)


def test_chunked_prefill_and_a_prefix_hit_give_the_cold_runs_bits(invariant):
    prompts = random_prompts(3, seed=2)
    chunked = run_with_logprobs(make_core(invariant, budget=7), prompts, _LOGPROBS)
    whole = run_with_logprobs(make_core(invariant, budget=512, chunked=False), prompts, _LOGPROBS)
    assert {i: r[:3] for i, r in chunked.items()} == {i: r[:3] for i, r in whole.items()}
    base = (random_prompts(1, seed=11)[0] * 40)[:100]
    repeated = [base, base, base[:70] + [7, 8, 9]]
    cached = run_one_by_one(make_core(invariant, block_size=32), repeated, _LOGPROBS)
    cold = run_one_by_one(make_core(invariant, prefix_caching=False), repeated, _LOGPROBS)
    assert [c for _, _, c in cached][1:] == [96, 64]
    assert [(t, lp) for t, lp, _ in cached] == [(t, lp) for t, lp, _ in cold]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"granitehybrid.attention.head_count_kv": [0, 2, 0, 4]},
         r"attention layers with \[2, 4\] K/V heads"),
        ({"granitehybrid.attention.head_count_kv": [0, 2, 0]},
         "attention.head_count_kv names 3 layers, block_count 4"),
        ({"granitehybrid.ssm.inner_size": 96},
         "ssm.inner_size 96 is not a multiple of embedding_length 64"),
    ],
)  # fmt: skip
def test_an_unsupported_variant_is_refused_in_one_line(converted, change, message):
    reader = GGUFReader(converted.f32)
    original = gguf_llama.field_value

    def field_value(reader, key, default=None):
        return change[key] if key in change else original(reader, key, default)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_llama, "field_value", field_value)
        with pytest.raises(ModelLoadError, match=message) as raised:
            gguf_llama.hf_config(reader)
    assert "\n" not in str(raised.value)
