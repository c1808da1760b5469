"""A Qwen3-MoE GGUF whose experts stay in their blocks (`--quantization gguf`):
each expert's gate/up and down run on the qblock kernel over the rows routed
to it, the float stacks are gone, and the experts take about their file's
bytes; the logits are close to the dequantized model of the same file, a
token's bits are its own beside any crowd, and a decode step reads only the
chosen experts."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader.loaded_model import load_model
from sluice.models.moe_blocks import BlockExperts
from sluice.models.native.qblock import qblock_available
from tests.gguf_files import add_byte_bpe_vocab, moe_gguf_tensors
from tests.gguf_quants import K_QUANT_WRITERS
from tests.invariance_runs import probe_output, random_prompt
from tests.model_factory import QWEN3_MOE_KIND, TinyModel, build_tiny_model
from tests.model_runs import prompt_logits
from tests.speculation_runs import GREEDY, make_core, run

pytestmark = pytest.mark.skipif(not qblock_available(), reason="needs the qblock kernel")
Q = GGMLQuantizationType
NUM_EXPERTS = 8


def q4_k_m(name: str) -> str:
    """Q4_K_M's kind of mix for the experts: Q6_K down, Q4_K gate and up."""
    return "Q6_K" if "down" in name else "Q4_K"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    # Rows of 256: whole K-quant super-blocks for both expert projections.
    return build_tiny_model(
        QWEN3_MOE_KIND, tmp_path_factory.mktemp("moe"), mlp_only_layers=[], hidden_size=256,
        moe_intermediate_size=256,
    )  # fmt: skip


@pytest.fixture(scope="module")
def q4_k_m_file(tiny, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("file") / "moe.Q4_K_M.gguf"
    write_gguf(tiny, path, q4_k_m)
    return path


def write_gguf(tiny: TinyModel, path: Path, expert_type, expert_width: int | None = None) -> None:
    """The tiny model as llama.cpp's qwen3moe: the experts in `expert_type(name)`
    (a GGUF type name), everything else in float32; `expert_width`: the
    experts' width the metadata claims (default: their own)."""
    config = tiny.config_dict
    writer = GGUFWriter(str(path), "qwen3moe")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(NUM_EXPERTS)
    writer.add_expert_used_count(2)
    writer.add_expert_feed_forward_length(expert_width or config["moe_intermediate_size"])
    add_byte_bpe_vocab(writer, config["vocab_size"], ["<|endoftext|>", "<s>", "</s>"])
    for name, array in moe_gguf_tensors(tiny).items():
        kind = expert_type(name) if "_exps" in name else "F32"
        if kind == "F32":
            writer.add_tensor(name, np.ascontiguousarray(array))
            continue
        rows = array.reshape(-1, array.shape[-1])  # [E out, in]
        if kind in K_QUANT_WRITERS:
            blocks, _ = K_QUANT_WRITERS[kind](rows)
        else:
            blocks = quantize(rows, Q[kind])
        writer.add_tensor(name, blocks.reshape(*array.shape[:2], -1), raw_dtype=Q[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def load(path: Path, tmp_path: Path, quantization: str | None = "gguf", dtype="float32"):
    config = ModelConfig(model=str(path), cache_dir=tmp_path / "cache", dtype=dtype,
                         quantization=quantization)  # fmt: skip
    return load_model(config)


def expert_file_bytes(path: Path) -> int:
    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if "_exps" in t.name)


def test_the_experts_stay_in_their_blocks_at_about_the_files_bytes(q4_k_m_file, tmp_path):
    loaded = load(q4_k_m_file, tmp_path)
    model = loaded.model
    for layer in model.layers:
        assert isinstance(layer.moe.kept, BlockExperts)
        assert layer.moe.kept.formats == ("Q4_K", "Q6_K")
        assert layer.moe.gate_up.numel() == 0 and layer.moe.down.numel() == 0
        # Gate and up (both Q4_K, whole 16-row tiles) run as one matrix.
        assert len(layer.moe.kept.gate_up[0].parts) == 1
    held, stored = model.expert_bytes(), expert_file_bytes(q4_k_m_file)
    # Q4_K packs at 4.625 bits a weight against the file's 4.5; Q6_K exactly.
    assert stored <= held <= 1.03 * stored
    assert model.weight_bytes() < held + 4 * 2**20  # no float copy of the experts
    size = f"{held / 2**20:.1f} MiB"
    assert f"expert weights {size} in GGUF blocks (Q4_K, Q6_K)" in loaded.choices.reason


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_layers_experts_give_the_dequantized_layers_output(q4_k_m_file, tmp_path, dtype):
    ours = load(q4_k_m_file, tmp_path, dtype=dtype).model
    dense = load(q4_k_m_file, tmp_path / "dense", None).model
    x = torch.randn(37, 256, generator=torch.Generator().manual_seed(1))
    for mine, theirs in zip(ours.layers, dense.layers, strict=True):
        got = mine.moe(x.to(ours.dtype), mine.swiglu).float()
        want = theirs.moe(x, theirs.swiglu)
        # The same block values and routing; only the activations' int8
        # rounding (and bfloat16) differs: 2% here. A wrong expert, row order
        # or block layout gives ~100%.
        assert (got - want).norm() < 0.04 * want.norm()


def test_logits_are_close_to_the_dequantized_model_of_the_same_file(q4_k_m_file, tmp_path):
    prompt = random_prompt(random.Random(0), 40)
    ours = prompt_logits(load(q4_k_m_file, tmp_path).model, prompt)
    dense = prompt_logits(load(q4_k_m_file, tmp_path / "dense", None).model, prompt)
    # Most positions within 5% of the logits' scale (int8 activations); a
    # few may take another expert where two nearly tie, and move further.
    scale = dense.abs().max()
    close = (ours - dense).abs().amax(dim=-1) < 0.05 * scale  # [positions]
    assert close.float().mean() > 0.9, close


def test_a_tokens_bits_are_its_own_beside_crowds_routed_elsewhere(q4_k_m_file, tmp_path):
    loaded = load(q4_k_m_file, tmp_path, dtype="bfloat16")
    rng = random.Random(3)
    probe = random_prompt(rng, 23)
    alone = probe_output(make_core(loaded, None), probe, [], rng)
    for trial in range(3):
        crowd = [random_prompt(rng, rng.randrange(5, 60)) for _ in range(rng.randrange(1, 5))]
        beside = probe_output(make_core(loaded, None), probe, crowd, rng)
        assert beside == alone, trial


def test_greedy_tokens_are_the_same_at_every_chunk_budget(q4_k_m_file, tmp_path):
    loaded = load(q4_k_m_file, tmp_path, dtype="bfloat16")
    rng = random.Random(5)
    prompts = [random_prompt(rng, rng.randrange(20, 70)) for _ in range(3)]
    outputs = [run(make_core(loaded, None, budget=budget), prompts, GREEDY)
               for budget in (7, 16, 256)]  # fmt: skip
    for index in range(len(prompts)):
        assert outputs[0][index][0] == outputs[1][index][0] == outputs[2][index][0]
        assert outputs[0][index][2] == outputs[1][index][2] == outputs[2][index][2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_layer_runs_its_experts_in_one_call_with_the_per_expert_paths_bits(
    q4_k_m_file, tmp_path, dtype
):
    model = load(q4_k_m_file, tmp_path, dtype=dtype).model
    x = torch.randn(19, 256, generator=torch.Generator().manual_seed(2)).to(model.dtype)
    for layer in model.layers:
        kept = layer.moe.kept
        assert kept.expert_array is not None  # the one-call path is the default
        one_call = layer.moe(x, layer.swiglu)
        kept.expert_array = None  # per expert, one call a projection
        assert torch.equal(layer.moe(x, layer.swiglu), one_call)


def test_a_decode_step_of_one_token_runs_only_its_k_experts(q4_k_m_file, tmp_path):
    loaded = load(q4_k_m_file, tmp_path)
    moe = loaded.model.layers[0].moe
    moe.kept.expert_array = None  # the per-expert path (test_native_moe_qblock: the one call)
    called: list[int] = []
    original = moe.kept.forward
    moe.kept.forward = lambda expert, swiglu, x: (
        called.append(expert) or original(expert, swiglu, x)
    )
    x = torch.randn(1, 256)
    moe(x, loaded.model.layers[0].swiglu)
    chosen, _ = moe.route(x)
    assert sorted(called) == sorted(chosen[0].tolist()) and len(called) == 2


def test_a_layer_with_an_expert_stack_in_floats_keeps_the_blocks_values_as_floats(tiny, tmp_path):
    path = tmp_path / "mixed.gguf"
    kinds = {"0": "Q8_0", "1": "Q8_0", "2": "Q4_0"}  # layer 1's up stack in F32
    write_gguf(tiny, path, lambda name: "F32" if "blk.1.ffn_up" in name else kinds[name[4]])
    loaded = load(path, tmp_path)
    layers = loaded.model.layers
    assert isinstance(layers[0].moe.kept, BlockExperts) and layers[1].moe.kept is None
    reference = load(path, tmp_path / "dense", None).model.layers[1].moe
    assert torch.equal(layers[1].moe.gate_up, reference.gate_up)
    assert torch.equal(layers[1].moe.down, reference.down)
    # Every layer's block types in one list, then the layer in floats.
    assert "in GGUF blocks (Q4_0, Q8_0) and float32;" in loaded.choices.reason


def test_expert_blocks_not_of_the_configs_shape_are_one_line(tiny, tmp_path):
    path = tmp_path / "moe.gguf"
    write_gguf(tiny, path, lambda name: "Q8_0", expert_width=128)  # the stacks are 256 wide
    with pytest.raises(
        ModelLoadError,
        match=r"layer 0 expert 0's gate_up blocks are \(512, 256\), expected \(256, 256\)",
    ) as error:
        load(path, tmp_path)
    assert "\n" not in str(error.value)
