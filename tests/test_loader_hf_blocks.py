"""An HF checkpoint quantized to GGUF blocks at load (loader/hf_blocks.py):
llama-quantize's Q4_K_M mix, tensor by tensor, served as a GGUF's blocks and
giving the greedy tokens of the float model holding the same block values."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import save_file

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import block_default, load_model
from sluice.loader.hf_blocks import block_type, hf_block_weights, use_more_bits
from sluice.loader.weights import iter_weights
from sluice.models.block_codes import BlockCodes
from sluice.models.native.qblock import qblock_available
from sluice.models.qblock_linear import QBlockEmbedding, QBlockLinear
from tests.invariance_runs import random_prompt
from tests.model_factory import build_tiny_model, write_tiny_tokenizer
from tests.model_runs import PagedRunner, greedy, prompt_logits

needs_kernel = pytest.mark.skipif(not qblock_available(), reason="needs the qblock kernel")


def test_q4_k_m_keeps_more_bits_on_llama_quantizes_layers():
    """llama-quant.cpp's use_more_bits for 16 layers: 0, 1, 4, 7, 10, 13, 14, 15."""
    assert [layer for layer in range(16) if use_more_bits(layer, 16)] == [
        0,
        1,
        4,
        7,
        10,
        13,
        14,
        15,
    ]


@pytest.mark.parametrize(
    ("name", "shape", "tied", "kind"),
    [
        ("model.layers.0.self_attn.q_proj.weight", (256, 256), False, "Q4_K"),
        ("model.layers.0.self_attn.v_proj.weight", (64, 256), False, "Q6_K"),
        ("model.layers.2.self_attn.v_proj.weight", (64, 256), False, "Q4_K"),
        ("model.layers.4.mlp.down_proj.weight", (256, 512), False, "Q6_K"),
        ("model.layers.3.mlp.down_proj.weight", (256, 512), False, "Q4_K"),
        ("lm_head.weight", (1000, 256), False, "Q6_K"),
        ("model.embed_tokens.weight", (1000, 256), False, "Q4_K"),
        ("model.embed_tokens.weight", (1000, 256), True, "Q6_K"),
        ("model.layers.0.self_attn.q_proj.weight", (96, 96), False, "Q5_0"),
        ("model.layers.0.self_attn.v_proj.weight", (96, 96), False, "Q8_0"),
        ("model.layers.0.self_attn.q_proj.weight", (96, 100), False, None),
        ("model.layers.0.input_layernorm.weight", (256,), False, None),
        ("model.layers.0.self_attn.q_proj.bias", (256,), False, None),
    ],
)
def test_the_q4_k_m_mix_by_tensor(name, shape, tied, kind):
    assert block_type(name, shape, "q4_k_m", 16, tied) == kind


def test_q8_0_puts_every_matrix_in_q8_0():
    assert block_type("model.layers.0.mlp.down_proj.weight", (256, 512), "q8_0", 16, False) == (
        "Q8_0"
    )
    assert block_type("lm_head.weight", (1000, 256), "q8_0", 16, False) == "Q8_0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "llama"
    model = build_tiny_model(
        "llama_tied", folder, hidden_size=256, intermediate_size=512, head_dim=64,
        num_hidden_layers=8,
    )  # fmt: skip
    write_tiny_tokenizer(folder)
    return model


@pytest.fixture(scope="module")
def dequantized(tiny, tmp_path_factory):
    """The tiny model's Q4_K_M block values as a float32 checkpoint."""
    folder = tmp_path_factory.mktemp("dequantized")
    tensors = {}
    for name, weight in hf_block_weights(
        iter_weights([tiny.path / "model.safetensors"]), "q4_k_m", tiny.config_dict
    ):
        values = weight.dequantize() if isinstance(weight, BlockCodes) else weight.numpy()
        tensors[name] = torch.as_tensor(values, dtype=torch.float32).contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    for extra in tiny.path.iterdir():
        if not extra.name.endswith(".safetensors"):
            (folder / extra.name).write_bytes(extra.read_bytes())
    return folder


def load(path, tmp_path, quantization="auto", dtype="float32"):
    return load_model(
        ModelConfig(model=str(path), cache_dir=tmp_path, dtype=dtype, quantization=quantization)
    )


@needs_kernel
def test_auto_quantizes_a_checkpoint_from_the_bound_on_and_says_why(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(block_default, "BLOCKS_FROM_BYTES", 0)
    loaded = load(tiny.path, tmp_path)
    model = loaded.model
    assert all(
        isinstance(getattr(layer, name), QBlockLinear)
        for layer in model.layers
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    )
    assert isinstance(model.token_embedding, QBlockEmbedding)
    # q and k Q4_K as one matrix; v Q6_K on layer 0 (use_more_bits), Q4_K on layer 2.
    assert [part.format.name for part in model.layers[0].qkv_proj.parts] == ["Q4_K", "Q6_K"]
    assert [part.format.name for part in model.layers[2].qkv_proj.parts] == ["Q4_K"]
    assert "quantized to Q4_K_M at load" in loaded.choices.reason
    assert "Q4_K_M blocks quantized at load" in loaded.choices.reason
    assert not list(tmp_path.rglob("*.safetensors"))  # nothing written


@needs_kernel
def test_below_the_bound_auto_keeps_its_default(tiny, tmp_path):
    loaded = load(tiny.path, tmp_path)
    assert not isinstance(loaded.model.layers[0].qkv_proj, QBlockLinear)


@needs_kernel
def test_the_blocks_give_the_greedy_tokens_of_the_dequantized_model(tiny, dequantized, tmp_path):
    """The dequantized model's greedy run of 16, fed back to both, is picked by
    the blocks wherever it leads its runner-up by a quarter of the logits'
    spread (the int8 activations move this random model's logits by up to
    ~0.5 of a spread of ~1.6: near-ties, such as token 12 of the first prompt
    and token 1 of the third, may flip and are not checked)."""
    blocks = load(tiny.path, tmp_path, "q4_k_m").model
    dense = load(dequantized, tmp_path / "dense", None).model
    rng = random.Random(11)
    checked = 0
    for _ in range(3):
        prompt = random_prompt(rng, 24)
        tokens = prompt + greedy(PagedRunner(dense), prompt, 16)
        ours, theirs = prompt_logits(blocks, tokens), prompt_logits(dense, tokens)
        for position in range(len(prompt) - 1, len(tokens) - 1):
            top = theirs[position].topk(2).values
            if top[0] - top[1] > 0.25 * theirs[position].std():
                assert int(ours[position].argmax()) == tokens[position + 1], position
                checked += 1
    assert checked >= 12  # of 48 positions


@needs_kernel
def test_q8_0_serves_every_matrix_in_q8_0(tiny, tmp_path):
    model = load(tiny.path, tmp_path, "q8_0").model
    assert {part.format.name for part in model.layers[0].qkv_proj.parts} == {"Q8_0"}


@needs_kernel
def test_a_gguf_file_is_not_quantized_again(tmp_path):
    from sluice.loader.sources import embedded_gguf_path

    with pytest.raises(ModelLoadError, match="keeps its own blocks"):
        load(embedded_gguf_path(), tmp_path, "q4_k_m")
