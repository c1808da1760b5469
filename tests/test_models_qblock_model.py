"""A GGUF served with its blocks kept (`--quantization gguf`): the file's own
values, close to the float model, a row's bits its own, speculation exact."""

from __future__ import annotations

import random

import pytest
import torch

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import load_model
from sluice.models.native.qblock import qblock_available
from sluice.models.qblock_linear import QBlockEmbedding, QBlockLinear
from tests.gguf_files import write_tiny_gguf
from tests.invariance_runs import probe_output, random_prompt
from tests.model_factory import build_tiny_model
from tests.model_runs import assert_close_to_scale, prompt_logits
from tests.speculation_runs import (
    GREEDY,
    assert_fused_gives_python_bits,
    make_core,
    ngram,
    repeating_prompt,
    run,
)

pytestmark = pytest.mark.skipif(not qblock_available(), reason="needs the qblock kernel")


def mixed_types(hf_name: str) -> str | None:
    """Q4_K_M's kind of mix: Q6_K for v and down, Q4_K elsewhere, Q8_0 embedding."""
    if "v_proj" in hf_name or "down_proj" in hf_name:
        return "Q6_K"
    return "Q8_0" if "embed_tokens" in hf_name else "Q4_K"


@pytest.fixture(scope="module", params=["llama_tied", "llama3_untied"])
def tiny_file(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    tiny = build_tiny_model(
        request.param, folder / "hf", hidden_size=256, intermediate_size=512, head_dim=64
    )
    return tiny, write_tiny_gguf(tiny, folder / "Tiny.Q4_K_M.gguf", mixed_types)


def load(path, tmp_path, quantization, dtype="float32"):
    config = ModelConfig(
        model=str(path), cache_dir=tmp_path, dtype=dtype, quantization=quantization
    )
    return load_model(config)


def test_every_matrix_stays_in_its_blocks_and_the_cache_holds_no_weights(tiny_file, tmp_path):
    _, path = tiny_file
    loaded = load(path, tmp_path, "gguf")
    model = loaded.model
    assert all(
        isinstance(getattr(layer, name), QBlockLinear)
        for layer in model.layers
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    )
    assert isinstance(model.lm_head, QBlockLinear)
    assert isinstance(model.token_embedding, QBlockEmbedding)
    # q and k (both Q4_K, whole 16-row tiles) run as one matrix; v is Q6_K.
    assert [part.format.name for part in model.layers[0].qkv_proj.parts] == ["Q4_K", "Q6_K"]
    assert [part.out_features for part in model.layers[0].qkv_proj.parts] == [256 + 128, 128]
    (folder,) = [entry for entry in tmp_path.iterdir() if entry.name.endswith("-meta")]
    assert not list(folder.glob("*.safetensors"))
    assert "GGUF blocks kept" in loaded.choices.reason


def test_logits_are_close_to_the_float_model_of_the_same_file(tiny_file, tmp_path):
    _, path = tiny_file
    prompt = random_prompt(random.Random(0), 40)
    ours = prompt_logits(load(path, tmp_path, "gguf").model, prompt)
    dense = prompt_logits(load(path, tmp_path / "dense", None).model, prompt)
    # The same block values; only the activations' int8 rounding differs: on
    # this random model that is 3% (L2) with Q8_0 weights, 5% with this mix.
    # A wrong row order or block layout gives 100%.
    assert_close_to_scale(ours, dense, rel=0.12)
    assert (ours - dense).norm() < 0.08 * dense.norm()


def test_a_rows_bits_are_its_own_beside_any_crowd(tiny_file, tmp_path):
    _, path = tiny_file
    loaded = load(path, tmp_path, "gguf", dtype="bfloat16")
    rng = random.Random(3)
    probe = random_prompt(rng, 23)
    alone = probe_output(make_core(loaded, None), probe, [], rng)
    for trial in range(3):
        crowd = [random_prompt(rng, rng.randrange(5, 60)) for _ in range(rng.randrange(1, 5))]
        beside = probe_output(make_core(loaded, None), probe, crowd, rng)
        assert beside == alone, trial


def test_speculation_keeps_the_greedy_bits(tiny_file, tmp_path):
    _, path = tiny_file
    loaded = load(path, tmp_path, "gguf", dtype="bfloat16")
    rng = random.Random(7)
    prompts = [repeating_prompt(rng, 60) for _ in range(3)]
    plain = run(make_core(loaded, None), prompts, GREEDY)
    drafted = run(make_core(loaded, ngram()), prompts, GREEDY)
    for index in plain:
        assert drafted[index][0] == plain[index][0]
        assert drafted[index][2] == plain[index][2]


def test_decode_steps_run_each_layer_in_one_native_call_with_the_python_paths_bits(
    tiny_file, tmp_path
):
    _, path = tiny_file
    loaded = load(path, tmp_path, "gguf", dtype="bfloat16")
    layers = loaded.model.layers
    assert all(layer.fused_decode is not None for layer in layers)
    assert f"decode steps: {len(layers)} of {len(layers)} decoder layers" in loaded.choices.reason
    assert_fused_gives_python_bits(loaded, seed=5)


def test_an_hf_folder_cannot_keep_gguf_blocks(tiny_file, tmp_path):
    tiny, _ = tiny_file
    with pytest.raises(ModelLoadError, match="keeps a GGUF file's blocks"):
        load(tiny.path, tmp_path, "gguf")


def test_parts_of_one_format_run_as_one_matrix_with_the_same_bits():
    from sluice.loader.gguf_blocks import decode_blocks
    from sluice.models.native.qblock import QBlockMatrix
    from sluice.models.qblock_linear import merged_parts
    from tests.gguf_quants import quantized

    def matrix(name, rows, seed):
        return QBlockMatrix.from_codes(decode_blocks(quantized(name, rows, 256, seed), name, 256))

    parts = [
        matrix("Q4_K", 32, 1),
        matrix("Q4_K", 20, 2),
        matrix("Q4_K", 16, 3),
        matrix("Q6_K", 16, 4),
    ]
    merged = merged_parts(parts)
    # 32 rows fill whole tiles: the next joins them; 20 do not: the third stays apart.
    assert [m.out_features for m in merged] == [52, 16, 16]
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    assert torch.equal(QBlockLinear(merged, None)(x), QBlockLinear(parts, None)(x))
