"""The decoder with mixture-of-experts layers (sluice/models/moe_decoder.py) on a
tiny random Qwen3-MoE (8 experts, top-2 renormalised, the middle layer
dense): float32 logits and greedy `generate` against transformers, the
parameter counts of the startup line, checkpoints that do not match, and the
row-invariant default bitwise alone and in crowds."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

from sluice.cli import main
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import ModelLoadError
from sluice.loader.choices import ModelChoices
from sluice.loader.loaded_model import LoadedModel
from sluice.models import calibration
from sluice.models.families.registry import build_model, parse_hf_config
from sluice.models.llama import LlamaDecoderLayer
from sluice.models.moe_decoder import (
    MoeDecoderLayer,
    MoeForCausalLM,
    describe_experts,
    parameter_counts,
)
from sluice.models.native.int8 import int8_gemm_kernels
from tests.engine_paths import check_greedy_equals_transformers_generate
from tests.invariance_runs import probe_output, random_prompt
from tests.model_factory import (
    QWEN2_MOE_KIND,
    QWEN3_MOE_KIND,
    TinyModel,
    build_tiny_model,
    make_core,
    write_tiny_tokenizer,
)
from tests.model_runs import (
    PagedRunner,
    assert_close_to_scale,
    greedy,
    hf_logits,
    loaded_float32,
    prompt_logits,
    random_prompts,
)
from tests.speculation_runs import make_core as make_speculation_core
from tests.speculation_runs import ngram, repeating_prompt
from tests.speculation_runs import run as run_speculation


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_model(QWEN3_MOE_KIND, tmp_path_factory.mktemp(QWEN3_MOE_KIND))


@pytest.fixture(scope="module")
def loaded(tiny) -> LoadedModel:
    return loaded_float32(tiny)


def test_sparse_layers_run_experts_and_mlp_only_layers_stay_dense(loaded):
    kinds = [type(layer) for layer in loaded.model.layers]
    assert kinds == [MoeDecoderLayer, LlamaDecoderLayer, MoeDecoderLayer]
    assert not hasattr(loaded.model.layers[0], "gate_up_proj")


def test_float32_logits_match_transformers(loaded, tiny):
    for prompt in random_prompts(3, seed=4):
        assert_close_to_scale(prompt_logits(loaded.model, prompt), hf_logits(tiny, prompt), 1e-5)


def test_greedy_tokens_equal_transformers_generate(loaded, tiny):
    check_greedy_equals_transformers_generate(loaded, tiny)


def test_parameter_counts_are_transformers_and_k_of_the_experts(loaded, tiny):
    total, active = parameter_counts(loaded.model_config)
    assert total == sum(p.numel() for p in tiny.hf_model.parameters())
    unused_experts = 8 - 2
    assert active == total - 2 * unused_experts * 3 * 64 * 32  # two MoE layers
    note = describe_experts(loaded.model)
    assert note == (
        "mixture of experts: 8 experts, 2 per token; 226.85K parameters, 153.12K active; "
        "expert weights 0.4 MiB in float32"
    )
    expert_bytes = 2 * 8 * 3 * 64 * 32 * 4
    assert loaded.model.expert_bytes() == expert_bytes


def test_qwen2_moe_with_its_shared_expert_matches_transformers(tmp_path):
    """q/k/v bias, top-2 without renormalising, a gated shared expert."""
    tiny = build_tiny_model(QWEN2_MOE_KIND, tmp_path)
    loaded = loaded_float32(tiny)
    assert loaded.model.layers[0].moe.shared is not None
    prompt = random_prompts(1, seed=6)[0]
    assert_close_to_scale(prompt_logits(loaded.model, prompt), hf_logits(tiny, prompt), 1e-5)
    with torch.no_grad():
        out = tiny.hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
            pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    assert greedy(PagedRunner(loaded.model), prompt, 12) == out[0, len(prompt) :].tolist()
    total, _ = parameter_counts(loaded.model_config)
    assert total == sum(p.numel() for p in tiny.hf_model.parameters())


def test_a_dense_model_has_no_experts_note(tmp_path):
    tiny = build_tiny_model("qwen3_tied", tmp_path)
    assert describe_experts(loaded_float32(tiny).model) is None


def fresh_model(tiny: TinyModel, dtype=torch.float32) -> MoeForCausalLM:
    model = build_model(parse_hf_config(tiny.config_dict), dtype, torch.device("cpu"), False)
    assert isinstance(model, MoeForCausalLM)
    return model


def test_a_missing_expert_is_named(tiny):
    dropped = "model.layers.2.mlp.experts.7.down_proj.weight"
    weights = ((name, t) for name, t in tiny.weights() if name != dropped)
    with pytest.raises(ModelLoadError, match=f"missing {dropped}; unexpected none"):
        fresh_model(tiny).load_weights(weights)


def test_a_misshapen_expert_tensor_is_named(tiny):
    def weights():
        for name, tensor in tiny.weights():
            if name == "model.layers.0.mlp.experts.3.gate_proj.weight":
                tensor = tensor[:, :32]
            yield name, tensor

    with pytest.raises(ModelLoadError, match=r"experts\.3\.gate_proj\.weight has shape \(32, 32\)"):
        fresh_model(tiny).load_weights(weights())


def test_an_expert_beyond_the_config_is_unexpected(tiny):
    extra = ("model.layers.0.mlp.experts.8.up_proj.weight", torch.zeros(32, 64))
    with pytest.raises(ModelLoadError, match=r"unexpected model\.layers\.0\.mlp\.experts\.8"):
        fresh_model(tiny).load_weights([*tiny.weights(), extra])


def test_weight_only_quantization_leaves_the_experts_in_the_model_dtype(tiny):
    model = fresh_model(tiny)
    model.load_weights(tiny.weights())
    experts = model.layers[0].moe.gate_up.clone()
    model.quantize("int8")
    assert model.layers[0].qkv_proj.quantized is not None
    assert torch.equal(model.layers[0].moe.gate_up, experts)
    assert model.layers[1].gate_up_proj.quantized is not None  # the dense layer's MLP


@pytest.fixture(scope="module")
def row_invariant(loaded, tiny) -> LoadedModel:
    if int8_gemm_kernels() is None:
        pytest.skip("no native int8 matmul (AVX512-VNNI) here")
    model = fresh_model(tiny, torch.bfloat16)
    model.load_weights(tiny.weights())
    rng = random.Random(7)
    calibration.quantize_row_invariant(model, [rng.randrange(3, 512) for _ in range(300)])
    return replace(loaded, model=model, choices=ModelChoices("bfloat16", None, "as asked"))


def test_the_row_invariant_default_gives_attention_int8_and_leaves_the_experts(row_invariant):
    layers = row_invariant.model.layers
    assert layers[0].qkv_proj.int8_activations is not None
    assert layers[1].down_proj.int8_activations is not None  # the dense layer's MLP
    assert layers[0].moe.gate_up.dtype == torch.bfloat16
    assert layers[0].fused_decode is None


def test_a_greedy_request_is_bitwise_the_same_alone_and_in_random_crowds(row_invariant):
    rng = random.Random(16)
    probe = random_prompt(rng, 37)

    def core():
        return make_core(row_invariant, budget=4096, chunked=False, prefix_caching=False)

    alone = probe_output(core(), probe, [], rng)
    for trial in range(6):
        crowd = [random_prompt(rng, rng.randrange(3, 60)) for _ in range(rng.randrange(1, 14))]
        assert probe_output(core(), probe, crowd, rng) == alone, f"trial {trial}"


def test_speculation_keeps_the_row_invariant_defaults_greedy_bits(row_invariant):
    """Verified drafts route like any row: tokens and logprobs bitwise those
    of plain decoding (prompts prefilled whole: a budget of 512)."""
    rng = random.Random(1)
    prompts = [repeating_prompt(rng, rng.randrange(20, 90)) for _ in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2)
    plain = run_speculation(make_speculation_core(row_invariant, None, budget=512), prompts, params)
    core = make_speculation_core(row_invariant, ngram(k=6), budget=512)
    speculated = run_speculation(core, prompts, params)
    assert core.speculator.counters.num_accepted_tokens > 0
    for i in plain:
        assert speculated[i][:3] == plain[i][:3], f"request {i}"


@pytest.mark.parametrize(
    ("config_change", "dropped", "message"),
    [
        ({"num_experts_per_tok": 9}, None, "num_experts_per_tok 9 must be between 1 and"),
        ({}, "model.layers.2.mlp.experts.5.up_proj.weight", "missing model.layers.2.mlp.experts.5"),
    ],
)
def test_sluice_serve_refuses_experts_it_cannot_run_with_exit_status_2(
    tiny, tmp_path, capsys, config_change, dropped, message
):
    (tmp_path / "config.json").write_text(json.dumps(tiny.config_dict | config_change))
    save_file({name: t for name, t in tiny.weights() if name != dropped},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    write_tiny_tokenizer(tmp_path, num_tokens=512)
    status = main(["serve", "--model", str(tmp_path), "--port", "0", "--in-process",
                   "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert message in err
