"""A Qwen3-MoE GGUF as llama.cpp's converter writes it (`qwen3moe`: the router
`ffn_gate_inp`, each projection of every expert stacked into one
`ffn_*_exps` tensor [E, out, in], the expert counts in metadata): converted
and loaded, it runs like transformers on the weights its blocks encode, with
the matrices dequantized or (`--quantization gguf`) kept in blocks; an expert
type sluice does not read is one line naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader.loaded_model import load_model
from sluice.models.moe_decoder import MoeForCausalLM
from sluice.models.native.qblock import qblock_available, qblock_rows
from tests.gguf_files import add_byte_bpe_vocab, moe_gguf_tensors
from tests.model_factory import QWEN3_MOE_KIND, TinyModel, build_tiny_model
from tests.model_runs import PagedRunner, greedy

Q = GGMLQuantizationType
PROMPT = [1, 17, 300, 45, 9, 88, 211, 5, 402, 77, 3, 150, 64]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    # Every layer sparse: llama.cpp's qwen3moe has no dense layers.
    return build_tiny_model(QWEN3_MOE_KIND, tmp_path_factory.mktemp("moe"), mlp_only_layers=[])


def write_moe_gguf(tiny: TinyModel, path: Path, expert_type: Q = Q.F32) -> dict[str, np.ndarray]:
    """The tiny model as llama.cpp's qwen3moe; the experts (and the attention
    matrices) in `expert_type`. Returns GGUF name -> the values stored."""
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
    writer.add_expert_count(8)
    writer.add_expert_used_count(2)
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    add_byte_bpe_vocab(writer, config["vocab_size"], ["<|endoftext|>", "<s>", "</s>"])
    stored = {}
    for name, array in moe_gguf_tensors(tiny).items():
        is_attention = ".attn_" in name and array.ndim == 2
        kind = Q.F32
        if "_exps" in name or (is_attention and expert_type != Q.MXFP4):
            kind = expert_type
        if kind == Q.F32:
            writer.add_tensor(name, np.ascontiguousarray(array))
            stored[name] = array
        elif kind == Q.MXFP4:  # bytes of the right size; sluice refuses the type itself
            blocks = np.zeros((*array.shape[:-1], array.shape[-1] // 32 * 17), np.uint8)
            writer.add_tensor(name, blocks, raw_dtype=kind)
        else:
            blocks = quantize(array, kind)
            writer.add_tensor(name, blocks, raw_dtype=kind)
            stored[name] = dequantize(blocks, kind).reshape(array.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def load(path: Path, tmp_path: Path, quantization: str | None = None):
    config = ModelConfig(model=str(path), cache_dir=tmp_path / "cache", dtype="float32",
                         quantization=quantization)  # fmt: skip
    return load_model(config)


def hf_greedy_on(folder: Path, prompt: list[int], num_new: int) -> list[int]:
    """transformers on the HF folder sluice converted the GGUF into."""
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = reference.generate(torch.tensor([prompt]), do_sample=False,
                                 max_new_tokens=num_new, eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def test_an_f32_moe_gguf_runs_like_transformers_on_the_original_weights(tiny, tmp_path):
    write_moe_gguf(tiny, tmp_path / "moe.gguf")
    loaded = load(tmp_path / "moe.gguf", tmp_path)
    assert isinstance(loaded.model, MoeForCausalLM)
    config = loaded.model_config
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (8, 2, True)
    assert "mixture of experts: 8 experts, 2 per token" in loaded.choices.reason
    ours = greedy(PagedRunner(loaded.model), PROMPT, 16)
    with torch.no_grad():
        expected = tiny.hf_model.generate(torch.tensor([PROMPT]), do_sample=False,
                                          max_new_tokens=16, eos_token_id=None, pad_token_id=0)  # fmt: skip
    assert ours == expected[0, len(PROMPT) :].tolist()


@pytest.mark.parametrize("kind", [Q.Q8_0, Q.Q4_0])
def test_quantized_experts_run_like_transformers_on_the_values_they_encode(tiny, tmp_path, kind):
    stored = write_moe_gguf(tiny, tmp_path / "moe.gguf", kind)
    loaded = load(tmp_path / "moe.gguf", tmp_path)
    experts = loaded.model.layers[1].moe
    want = stored["blk.1.ffn_down_exps.weight"]  # [E, H, I]
    np.testing.assert_array_equal(experts.down.detach().numpy(), want)
    ours = greedy(PagedRunner(loaded.model), PROMPT, 16)
    assert ours == hf_greedy_on(loaded.folder, PROMPT, 16)


@pytest.mark.skipif(not qblock_available(), reason="no AVX512-VNNI block kernels here")
def test_kept_blocks_serve_attention_and_the_experts(tiny, tmp_path):
    """`--quantization gguf`: the attention matrices and every expert's stay in
    their Q8_0 blocks (models/moe_blocks.py), holding the file's values."""
    stored = write_moe_gguf(tiny, tmp_path / "moe.gguf", Q.Q8_0)
    loaded = load(tmp_path / "moe.gguf", tmp_path, quantization="gguf")
    layer = loaded.model.layers[0]
    assert type(layer.qkv_proj).__name__ == "QBlockLinear"
    (gate_up,) = layer.moe.kept.gate_up[3].parts  # expert 3: gate rows, then up rows
    rows = qblock_rows(gate_up, torch.arange(32))
    np.testing.assert_array_equal(rows.numpy(), stored["blk.0.ffn_gate_exps.weight"][3])


def test_an_expert_type_sluice_does_not_read_is_one_line_naming_it(tiny, tmp_path):
    write_moe_gguf(tiny, tmp_path / "moe.gguf", Q.MXFP4)
    with pytest.raises(ModelLoadError, match=r"type MXFP4 \(tensor blk\.0\.ffn_gate_exps") as error:
        load(tmp_path / "moe.gguf", tmp_path)
    assert "\n" not in str(error.value)
