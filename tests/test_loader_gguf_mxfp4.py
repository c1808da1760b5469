"""gpt-oss from a GGUF as llama.cpp's convert_hf_to_gguf.py writes it
(sluice/loader/gguf_mxfp4.py, families/gpt_oss.py's GGUF layout): a tiny
random gpt-oss published as OpenAI does (MXFP4 experts), converted by the
real converter (its vocabulary step alone replaced: a tiny model has no
tokenizer it knows), gives the HF folder's config, its expert stacks back
bit for bit in the release's layout, the experts kept in 4 bits at the
file's bytes, the HF folder's logits and greedy tokens, and logits close to
transformers on the same rounded values."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize
from safetensors.torch import load_file

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import gguf_llama, gguf_mxfp4
from sluice.loader.gguf_tensors import gguf_weights
from sluice.loader.loaded_model import _weights_estimate, load_model
from sluice.loader.sources import resolve_source
from sluice.loader.weights import checkpoint_files
from sluice.models.families.registry import parse_hf_config
from sluice.models.mxfp4_experts import Mxfp4Experts
from sluice.models.native.mxfp4 import mxfp4_available
from sluice.models.native.qblock import qblock_available
from sluice.tools.harmony import HARMONY
from sluice.tools.parsers import guess_tool_call_parser
from tests.gpt_oss_files import (
    LLAMA_CPP,
    build_tiny_gpt_oss,
    convert_with_llama_cpp,
    gpt_oss_template,
    write_mxfp4_folder,
)
from tests.invariance_runs import random_prompt
from tests.model_factory import TinyModel, write_tiny_tokenizer
from tests.model_runs import PagedRunner, greedy, hf_logits, prompt_logits

Q = GGMLQuantizationType
PROMPT = [1, 17, 300, 45, 9, 88, 211, 5, 402, 77, 3, 150, 64, 33, 19, 260, 7]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[TinyModel, Path, dict[str, torch.Tensor], Path]:
    """(tiny model on the rounded values, its MXFP4 folder, the folder's tensors,
    the converter's GGUF of it with every other tensor in F32). The SwiGLU
    limit is llama.cpp's fixed 7: GGUF has no key for another."""
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {LLAMA_CPP} (set SLUICE_LLAMA_CPP)")
    directory = tmp_path_factory.mktemp("gpt_oss_gguf")
    tiny = build_tiny_gpt_oss(directory / "float", swiglu_limit=7.0)
    state = write_mxfp4_folder(tiny, directory / "mxfp4")
    write_tiny_tokenizer(directory / "mxfp4", num_tokens=512)
    (directory / "mxfp4" / "chat_template.jinja").write_text(gpt_oss_template())
    gguf_path = convert_with_llama_cpp(directory / "mxfp4", directory / "tiny.gguf")
    return tiny, directory / "mxfp4", state, gguf_path


def test_ggml_groups_become_the_releases_blocks_and_scales():
    """ggml's MXFP4 group (exponent, then byte j = value j | value j + 16 << 4)
    read back as OpenAI's (byte j = value 2j | value 2j + 1 << 4), by hand."""
    rng = np.random.default_rng(0)
    values = rng.integers(0, 16, size=(2, 3, 4, 32), dtype=np.uint8)  # [E, rows, G, 32] codes
    exponents = rng.integers(100, 140, size=(2, 3, 4), dtype=np.uint8)
    ggml = np.concatenate([exponents[..., None], values[..., :16] | (values[..., 16:] << 4)], -1)
    tensor = SimpleNamespace(name="blk.0.ffn_down_exps.weight", shape=(128, 3, 2),
                             data=ggml.reshape(2, 3, 4 * 17))  # fmt: skip
    blocks, scales = gguf_mxfp4.release_blocks(tensor)
    np.testing.assert_array_equal(blocks, values[..., 0::2] | (values[..., 1::2] << 4))
    np.testing.assert_array_equal(scales, exponents)


def test_gate_and_up_rows_are_interleaved_again():
    gate, up = np.arange(12).reshape(2, 3, 2), 100 + np.arange(12).reshape(2, 3, 2)
    both = gguf_mxfp4.interleave_rows(gate, up)  # [2, 6, 2]
    np.testing.assert_array_equal(both[:, 0::2], gate)
    np.testing.assert_array_equal(both[:, 1::2], up)


def load(path: Path, tmp_path: Path, **options):
    return load_model(ModelConfig(model=str(path), cache_dir=tmp_path / "cache", **options))


def test_the_converters_metadata_gives_the_hf_folders_config(release):
    _, folder, _, gguf_path = release
    ours = parse_hf_config(gguf_llama.hf_config(GGUFReader(gguf_path)))
    theirs = parse_hf_config(json.loads((folder / "config.json").read_text()))
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)  # float32 in GGUF
    assert dataclasses.replace(ours, rms_norm_eps=theirs.rms_norm_eps) == theirs
    assert ours.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert (ours.num_experts, ours.num_experts_per_tok, ours.sliding_window) == (8, 2, 8)


def test_the_expert_stacks_come_back_bit_for_bit_in_the_releases_layout(release):
    """The converter moved gate and up apart and each 32-group's nibbles
    (values j and j + 16 in byte j); reading undoes both exactly."""
    _, _, state, gguf_path = release
    reader = GGUFReader(gguf_path)
    assert {t.tensor_type.name for t in reader.tensors if "_exps.weight" in t.name} == {"MXFP4"}
    tensors = dict(gguf_mxfp4.hf_tensors(reader, gguf_llama.hf_config(reader)))
    assert set(tensors) == set(state)
    for name, want in state.items():
        np.testing.assert_array_equal(tensors[name], want.numpy(), err_msg=name)


def test_the_gguf_loads_with_its_experts_in_4_bits_at_the_files_bytes(release, tmp_path):
    _, _, _, gguf_path = release
    loaded = load(gguf_path, tmp_path, dtype="float32")
    reader = GGUFReader(gguf_path)
    file_bytes = sum(int(t.n_bytes) for t in reader.tensors if "_exps." in t.name)  # with biases
    model = loaded.model
    if not mxfp4_available():
        pytest.fail("the native MXFP4 kernel is not built: the experts would load dequantized")
    for layer in model.layers:
        assert isinstance(layer.moe.kept, Mxfp4Experts)
        assert layer.moe.gate_up.numel() == 0 and layer.moe.down.numel() == 0
    assert model.expert_bytes() == file_bytes
    assert f"expert weights {file_bytes / 2**20:.1f} MiB in MXFP4;" in loaded.choices.reason
    converted = loaded.folder / "model.safetensors"
    kept = load_file(str(converted))
    assert kept["model.layers.0.mlp.experts.down_proj_blocks"].dtype == torch.uint8


def test_the_harmony_template_comes_from_the_gguf_and_picks_harmonys_parser(release, tmp_path):
    _, _, _, gguf_path = release
    loaded = load(gguf_path, tmp_path, dtype="float32")
    template = loaded.tokenizer.chat_template_source
    assert template == gpt_oss_template()
    assert guess_tool_call_parser(template) == HARMONY
    prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt.endswith("<|start|>user<|message|>hi<|end|><|start|>assistant")


def test_generation_stops_at_harmonys_return_and_call_as_in_llama_cpp(release, tmp_path):
    """The file names one eos (</s> here); llama.cpp also ends at <|return|>
    and <|call|> (ids 3 and 4 in the stub vocabulary), so a tool call ends."""
    _, _, _, gguf_path = release
    assert gguf_llama.hf_config(GGUFReader(gguf_path))["eos_token_id"] == [2, 3, 4]
    assert load(gguf_path, tmp_path, dtype="float32").eos_token_ids == {2, 3, 4}


def test_logits_and_greedy_tokens_equal_the_hf_folders(release, tmp_path):
    _, folder, _, gguf_path = release
    from_gguf = load(gguf_path, tmp_path, dtype="float32", quantization=None)
    from_folder = load(folder, tmp_path, dtype="float32", quantization=None)
    prompt = random_prompt(random.Random(0), 40)
    ours = prompt_logits(from_gguf.model, prompt)
    torch.testing.assert_close(ours, prompt_logits(from_folder.model, prompt), rtol=0, atol=0)
    tokens = greedy(PagedRunner(from_gguf.model), PROMPT, 16)
    assert tokens == greedy(PagedRunner(from_folder.model), PROMPT, 16)


def test_logits_are_close_to_transformers_on_the_same_values(release, tmp_path):
    tiny, _, _, gguf_path = release
    prompt = random_prompt(random.Random(1), 40)
    ours = prompt_logits(load(gguf_path, tmp_path, dtype="float32").model, prompt)
    reference = hf_logits(tiny, prompt)
    # The kernel's int8 activations differ from transformers' floats by about
    # 1%; where two experts nearly tie a position may route elsewhere.
    close = (ours - reference).abs().amax(dim=-1) < 0.05 * reference.abs().max()
    assert close.float().mean() > 0.9, close


def test_the_kept_block_path_reads_the_same_tensors(release):
    """`--quantization gguf`'s reader (loader/gguf_tensors.py) yields the
    release's tensors too: the experts' groups as the file's bits."""
    _, _, state, gguf_path = release
    reader = GGUFReader(gguf_path)
    tensors = dict(gguf_weights(reader, gguf_llama.hf_config(reader)))
    for name in ("gate_up_proj_blocks", "down_proj_scales", "gate_up_proj_bias"):
        full = f"model.layers.1.mlp.experts.{name}"
        assert torch.equal(tensors[full], state[full])
    assert torch.equal(
        tensors["model.layers.2.self_attn.sinks"], state["model.layers.2.self_attn.sinks"]
    )


def test_a_layer_missing_an_expert_stack_is_one_line_naming_it(release):
    _, _, _, gguf_path = release
    reader = GGUFReader(gguf_path)
    (tensor,) = [t for t in reader.tensors if t.name == "blk.0.ffn_down_exps.weight"]
    with pytest.raises(ModelLoadError, match=r"GGUF gpt-oss experts .* lack down_proj\.weight"):
        list(gguf_mxfp4.release_experts(
            [(t, gguf_llama.hf_tensor_name(t.name, gguf_llama.family(reader).gguf))
             for t in reader.tensors if "blk.0.ffn_" in t.name and t is not tensor
             and "_exps" in t.name],
            gguf_llama.family(reader).gguf,
        ))  # fmt: skip


@pytest.mark.skipif(not qblock_available(), reason="no AVX512-VNNI block kernels here")
def test_a_q8_0_file_keeps_attention_in_blocks_and_the_experts_in_mxfp4(release, tmp_path):
    """The converter's `--outtype q8_0` (the experts stay MXFP4) under
    `--quantization gguf`: attention runs on the file's Q8_0 blocks, the experts
    on their MXFP4 groups, and the logits stay close to the converted folder's
    (int8 activations against the blocks' exact values)."""
    _, folder, _, _ = release
    q8_path = convert_with_llama_cpp(folder, tmp_path / "q8.gguf", "q8_0")
    kept = load(q8_path, tmp_path, dtype="float32", quantization="gguf")
    layer = kept.model.layers[0]
    assert type(layer.qkv_proj).__name__ == "QBlockLinear"
    assert isinstance(layer.moe.kept, Mxfp4Experts)
    prompt = random_prompt(random.Random(2), 40)
    ours = prompt_logits(kept.model, prompt)
    converted = prompt_logits(
        load(q8_path, tmp_path, dtype="float32", quantization=None).model, prompt
    )
    close = (ours - converted).abs().amax(dim=-1) < 0.05 * converted.abs().max()
    assert close.float().mean() > 0.9, close


def test_the_memory_plan_counts_the_kept_experts_at_their_bytes(release, tmp_path):
    """The converted folder holds float32 tensors and the experts' uint8 groups:
    in bfloat16 the floats halve, the groups stay (where the kernel keeps them)."""
    _, _, state, gguf_path = release
    loaded = load(gguf_path, tmp_path, dtype="float32")
    files = checkpoint_files(loaded.folder)
    source = resolve_source(str(gguf_path))
    packed = sum(t.nbytes for name, t in state.items() if name.endswith(("_blocks", "_scales")))
    codes = sum(t.nbytes for name, t in state.items() if name.endswith("_blocks"))
    floats = sum(path.stat().st_size for path in files) - packed
    estimate = _weights_estimate(source, files, torch.bfloat16)
    assert estimate == floats // 2 + packed + (0 if mxfp4_available() else 3 * codes)


def rewrite_gguf(source: Path, target: Path, changes: dict[str, tuple | None]) -> Path:
    """`source` with some tensors replaced ((array, raw type or None)) or
    dropped (None), every metadata value copied."""
    reader = GGUFReader(source)
    writer = GGUFWriter(str(target), gguf_llama.field_value(reader, "general.architecture"))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        item = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=item)
    for tensor in reader.tensors:
        if tensor.name in changes and changes[tensor.name] is None:
            continue
        array, raw = changes.get(tensor.name) or (np.asarray(tensor.data), tensor.tensor_type)
        writer.add_tensor(tensor.name, np.ascontiguousarray(array), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def test_a_stack_in_another_type_loads_both_of_its_pair_as_their_exact_values(release, tmp_path):
    """Layer 1's up stack in F32 (its MXFP4 values): that layer's gate/up runs
    as floats holding the same values, the other layers stay in 4 bits, and the
    logits stay the all-MXFP4 file's within the kernel's int8 rounding."""
    _, _, _, gguf_path = release
    (up,) = [t for t in GGUFReader(gguf_path).tensors if t.name == "blk.1.ffn_up_exps.weight"]
    values = dequantize(np.asarray(up.data), up.tensor_type).reshape(8, 32, 64)
    mixed = rewrite_gguf(gguf_path, tmp_path / "mixed.gguf", {up.name: (values, None)})
    model = load(mixed, tmp_path, dtype="float32").model
    assert not isinstance(model.layers[1].moe.kept, Mxfp4Experts)
    np.testing.assert_array_equal(model.layers[1].moe.gate_up[:, 32:].numpy(), values)  # up rows
    assert isinstance(model.layers[0].moe.kept, Mxfp4Experts)
    prompt = random_prompt(random.Random(3), 40)
    ours = prompt_logits(model, prompt)
    reference = prompt_logits(load(gguf_path, tmp_path, dtype="float32").model, prompt)
    close = (ours - reference).abs().amax(dim=-1) < 0.05 * reference.abs().max()
    assert close.float().mean() > 0.9, close


def test_a_missing_or_unreadable_expert_stack_is_one_line_naming_it(release, tmp_path):
    _, _, _, gguf_path = release
    missing = rewrite_gguf(gguf_path, tmp_path / "m.gguf", {"blk.2.ffn_gate_exps.bias": None})
    with pytest.raises(
        ModelLoadError, match=r"experts model\.layers\.2\.mlp\.experts\. lack gate_proj\.bias"
    ):
        load(missing, tmp_path)
    (down,) = [t for t in GGUFReader(gguf_path).tensors if t.name == "blk.0.ffn_down_exps.weight"]
    iq = np.zeros((8, 64, GGML_QUANT_SIZES[Q.IQ4_NL][1]), np.uint8)  # rows of one block
    odd = rewrite_gguf(gguf_path, tmp_path / "iq.gguf", {down.name: (iq, Q.IQ4_NL)})
    with pytest.raises(
        ModelLoadError, match=r"type IQ4_NL \(tensor blk\.0\.ffn_down_exps"
    ) as error:
        load(odd, tmp_path)
    assert "\n" not in str(error.value)
