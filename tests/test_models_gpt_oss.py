"""gpt-oss (sluice/models/gpt_oss.py) on a tiny random GptOssConfig: 8 experts
top-2 with biases, the clamped SwiGLU (limit 1, so that it clamps), sliding
(window 8) and full layers in turn, attention sinks, YaRN past an original
context of 32. Its float32 logits and greedy tokens are transformers 5.24's,
and every engine path (chunked prefill, prefix hits, preemption, n-gram
speculation) gives the tokens of plain runs."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

from sluice.cli import main
from sluice.errors import ModelLoadError
from sluice.loader.choices import ModelChoices
from sluice.loader.loaded_model import LoadedModel
from sluice.models import calibration, gpt_oss
from sluice.models.execution_plan import ExecutionPlan
from sluice.models.families.registry import build_model, describe_family, parse_hf_config
from sluice.models.gpt_oss import GptOssDecoderLayer, GptOssForCausalLM
from sluice.models.kernel_plan import KernelPlan
from sluice.models.moe_decoder import describe_experts
from sluice.models.mxfp4 import E2M1_VALUES
from sluice.models.mxfp4_experts import clamped_swiglu
from sluice.models.native.int8 import int8_gemm_kernels
from sluice.models.plan_apply import apply
from tests.engine_paths import (
    check_chunked_prefill_equals_whole_prompts,
    check_greedy_equals_transformers_generate,
    check_preemption_resumes_exactly,
    check_prefix_cache_hit_equals_cold,
    check_speculation_keeps_greedy_tokens,
)
from tests.invariance_runs import probe_output, random_prompt
from tests.model_factory import TinyModel, make_core, write_tiny_tokenizer
from tests.model_runs import (
    PagedRunner,
    assert_close_to_scale,
    hf_logits,
    loaded_float32,
    prompt_logits,
    random_prompts,
)

WINDOW = 8


def build_tiny_gpt_oss(directory: Path, seed: int = 0) -> TinyModel:
    config = transformers.GptOssConfig(
        hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=WINDOW, swiglu_limit=1.0,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, rope_parameters={
            "rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32,
        },
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:  # sinks too: a logit of about one beside scores of about 0.1 shows
                param.normal_(0.0, 1.0 if name.endswith("sinks") else 0.1)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return TinyModel(kind="gpt_oss", path=Path(directory), hf_model=model)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_gpt_oss(tmp_path_factory.mktemp("gpt_oss"))


@pytest.fixture(scope="module")
def loaded(tiny) -> LoadedModel:
    return loaded_float32(tiny)


def test_layers_slide_and_attend_fully_in_turn_every_one_with_sinks(loaded):
    layers = loaded.model.layers
    assert type(loaded.model) is GptOssForCausalLM
    assert all(isinstance(layer, GptOssDecoderLayer) for layer in layers)
    assert [layer.is_sliding for layer in layers] == [True, False, True]
    assert loaded.model_config.sliding_window == WINDOW
    assert describe_family(loaded.model_config) == (
        "architecture GptOssForCausalLM: attention sinks run every layer's attention on the torch "
        "path, not the native attention kernels; its sliding-window layers (window 8) keep all "
        "their KV blocks; its MoE layers run the experts grouped by expert (moe.py: in the model "
        "dtype on tiles of 8 rows, or kept in the file's GGUF or MXFP4 blocks on their kernels), "
        "not the fused native decode call nor int8 weights"
    )


def test_the_execution_plan_leaves_every_layers_sinks_attention(tiny):
    model = loaded_float32(tiny).model
    kept = [layer.attend for layer in model.layers]
    apply(model, ExecutionPlan(KernelPlan()))
    assert [layer.attend for layer in model.layers] == kept


def test_float32_logits_match_transformers_past_the_window_and_the_original_context(loaded, tiny):
    prompts = [*random_prompts(2, seed=4), [random.Random(1).randrange(3, 512) for _ in range(70)]]
    for prompt in prompts:
        assert_close_to_scale(prompt_logits(loaded.model, prompt), hf_logits(tiny, prompt), 1e-5)


def test_a_chunk_after_a_prefill_and_decodes_match_transformers(loaded, tiny):
    prompt = random_prompts(1, seed=8)[0] + list(range(3, 30))
    runner, table = PagedRunner(loaded.model), []
    runner.step([prompt[:13]], [0], [table])
    chunk = runner.step([prompt[13:]], [13], [table])
    assert_close_to_scale(chunk[0], hf_logits(tiny, prompt)[-1], 1e-5)


def test_greedy_tokens_equal_transformers_generate(loaded, tiny):
    check_greedy_equals_transformers_generate(loaded, tiny)


def test_without_its_sinks_or_its_clamp_the_model_would_differ(loaded, tiny):
    """Each of the two shows on these weights: a test that ignored one would fail."""
    prompt = random_prompts(1, seed=2)[0]
    reference = hf_logits(tiny, prompt)
    layer = loaded.model.layers[1]
    saved = layer.sinks.clone()
    layer.sinks.fill_(float("-inf"))  # exp(-inf) = 0: no sink
    try:
        no_sinks = prompt_logits(loaded.model, prompt)
    finally:
        layer.sinks.copy_(saved)
    assert (no_sinks - reference).abs().max() > 1e-3 * reference.abs().max()
    gate_up = torch.linspace(-3, 3, 64).view(1, 64)
    assert not torch.equal(clamped_swiglu(1.702, 1.0, gate_up), clamped_swiglu(1.702, 9.0, gate_up))


def test_the_startup_note_counts_the_experts(loaded):
    note = describe_experts(loaded.model)
    assert note is not None and note.startswith("mixture of experts: 8 experts, 2 per token;")
    # Per layer: gate_up [8, 64, 64] and down [8, 64, 32] with biases [8, 64] each, float32.
    assert loaded.model.expert_bytes() == 3 * 4 * 8 * (64 * 64 + 64 * 32 + 64 + 64)


def test_bfloat16_is_no_further_from_float32_than_transformers_bfloat16(loaded, tiny):
    """On CPU in bfloat16 q and k rotate in the native RoPE + K/V write
    kernel, then the sinks' torch path reads the cache it wrote."""
    model = build_model(loaded.model_config, torch.bfloat16, torch.device("cpu"), False)
    model.load_weights(tiny.weights())
    assert all(layer.rope_write_kv is not None for layer in model.layers)
    prompt = random_prompts(1, seed=3)[0] + list(range(3, 40))
    reference = hf_logits(tiny, prompt)
    hf_bfloat16 = copy.deepcopy(tiny.hf_model).to(torch.bfloat16)
    with torch.no_grad():
        theirs = hf_bfloat16(torch.tensor([prompt])).logits[0].float()
    ours = prompt_logits(model, prompt)
    assert (ours - reference).abs().max() <= (theirs - reference).abs().max()


@pytest.fixture(scope="module")
def row_invariant(loaded, tiny) -> LoadedModel:
    """The default on CPU: bfloat16, attention int8 on fixed row tiles."""
    if int8_gemm_kernels() is None:
        pytest.skip("no native int8 matmul (AVX512-VNNI) here")
    model = build_model(loaded.model_config, torch.bfloat16, torch.device("cpu"), False)
    model.load_weights(tiny.weights())
    rng = random.Random(7)
    calibration.quantize_row_invariant(model, [rng.randrange(3, 512) for _ in range(300)])
    return replace(loaded, model=model, choices=ModelChoices("bfloat16", None, "as asked"))


def test_the_row_invariant_default_gives_a_request_the_same_bits_alone_and_in_crowds(
    row_invariant,
):
    rng = random.Random(16)
    probe = random_prompt(rng, 37)

    def core():
        return make_core(row_invariant, budget=4096, chunked=False, prefix_caching=False)

    alone = probe_output(core(), probe, [], rng)
    for trial in range(3):
        crowd = [random_prompt(rng, rng.randrange(3, 60)) for _ in range(rng.randrange(1, 10))]
        assert probe_output(core(), probe, crowd, rng) == alone, f"trial {trial}"


@pytest.mark.parametrize("budget", [7, 64])
def test_chunked_prefill_gives_the_same_tokens_as_whole_prompts(loaded, budget):
    check_chunked_prefill_equals_whole_prompts(loaded, budget, num_prompts=4, seed=1)


def test_a_prefix_cache_hit_gives_the_same_tokens_and_logprobs(loaded):
    check_prefix_cache_hit_equals_cold(loaded)


def test_preempted_requests_resume_with_the_same_greedy_tokens(loaded):
    check_preemption_resumes_exactly(loaded, num_prompts=8, num_blocks=32)


def test_speculation_gives_the_plain_runs_tokens(loaded, tiny):
    """Some drafts are rejected; no greedy token changes."""
    check_speculation_keeps_greedy_tokens(loaded, tiny, lengths=(20, 45))


def test_the_batch_invariant_model_matches_transformers_too(loaded, tiny):
    model = build_model(loaded.model_config, torch.float32, torch.device("cpu"), True)
    model.load_weights(tiny.weights())
    prompt = random_prompts(1, seed=12)[0]
    assert_close_to_scale(prompt_logits(model, prompt), hf_logits(tiny, prompt), 1e-5)


def test_a_missing_sink_or_a_misshapen_expert_stack_is_named(tiny):
    config = parse_hf_config(tiny.config_dict)
    dropped = "model.layers.1.self_attn.sinks"
    with pytest.raises(ModelLoadError, match=f"missing {dropped}; unexpected none"):
        build_model(config, torch.float32, "cpu", False).load_weights(
            (name, t) for name, t in tiny.weights() if name != dropped
        )

    def weights():
        for name, tensor in tiny.weights():
            if name == "model.layers.0.mlp.experts.down_proj":
                tensor = tensor[:4]
            yield name, tensor

    with pytest.raises(ModelLoadError, match=r"experts\.down_proj has shape \(4, 64, 32\)"):
        build_model(config, torch.float32, "cpu", False).load_weights(weights())


@pytest.mark.parametrize(
    ("config_change", "message"),
    [
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method 'bitsandbytes'"),
        ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
         "unsupported layer_types ['chunked_attention']"),
    ],
)  # fmt: skip
def test_sluice_serve_refuses_a_config_it_cannot_run_with_exit_status_2(
    tiny, tmp_path, capsys, config_change, message
):
    (tmp_path / "config.json").write_text(json.dumps(tiny.config_dict | config_change))
    save_file(dict(tiny.weights()), str(tmp_path / "model.safetensors"))
    write_tiny_tokenizer(tmp_path, num_tokens=512)
    status = main(["serve", "--model", str(tmp_path), "--port", "0", "--in-process",
                   "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert message in err


def to_mxfp4(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[E, out, in] -> (blocks [E, out, in / 32, 16], scales [E, out, in / 32], the
    values they hold): each group of 32 scaled by the power of two that fits
    its largest value in 6, then rounded to the nearest E2M1 value."""
    groups = weights.unflatten(-1, (-1, 32))  # [E, out, G, 32]
    exponents = torch.ceil(torch.log2(groups.abs().amax(-1) / 6.0))  # [E, out, G]
    table = torch.tensor(E2M1_VALUES)
    codes = (groups / torch.exp2(exponents)[..., None] - table[:8][:, None, None, None, None]).abs()
    codes = codes.argmin(0)  # [E, out, G, 32]: the nearest magnitude, then the sign bit
    codes = torch.where(groups < 0, codes + 8, codes).to(torch.uint8)
    values = table[codes.long()] * torch.exp2(exponents)[..., None]
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exponents + 127).to(torch.uint8), values.flatten(-2)


def test_an_mxfp4_checkpoint_as_openai_publishes_it_runs_dequantized(tmp_path, monkeypatch):
    """Expert stacks as `*_blocks`/`*_scales` ([out, in], gate/up interleaved
    rows) with quantization_config mxfp4, where the native MXFP4 kernel is not
    built: the model dequantizes them (into float32 here) and gives
    transformers' logits on the same values (tests/test_models_mxfp4_experts.py
    has them kept in 4 bits)."""
    monkeypatch.setattr(gpt_oss, "mxfp4_available", lambda: False)
    tiny = build_tiny_gpt_oss(tmp_path / "float")
    state = dict(tiny.weights())
    experts = tiny.hf_model.model.layers[0].mlp.experts
    with torch.no_grad():
        for index, layer in enumerate(tiny.hf_model.model.layers):
            stem = f"model.layers.{index}.mlp.experts."
            for proj in ("gate_up_proj", "down_proj"):
                param = getattr(layer.mlp.experts, proj)  # [E, in, out]
                blocks, scales, values = to_mxfp4(param.transpose(1, 2))
                param.copy_(values.transpose(1, 2))  # transformers runs the rounded values
                del state[stem + proj]
                state[stem + proj + "_blocks"], state[stem + proj + "_scales"] = blocks, scales
    assert experts.gate_up_proj.abs().max() > 0
    folder = tmp_path / "mxfp4"
    folder.mkdir()
    config = tiny.config_dict | {"quantization_config": {"quant_method": "mxfp4"}}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "model.safetensors"))
    ours = loaded_float32(replace(tiny, path=folder))
    prompt = random_prompts(1, seed=13)[0]
    assert_close_to_scale(prompt_logits(ours.model, prompt), hf_logits(tiny, prompt), 1e-5)
    unpaired = {
        k: v for k, v in state.items() if not k.endswith("layers.2.mlp.experts.down_proj_scales")
    }
    with pytest.raises(ModelLoadError, match=r"missing model\.layers\.2\.mlp\.experts\.down_proj; "
                       r"unexpected model\.layers\.2\.mlp\.experts\.down_proj_blocks"):  # fmt: skip
        build_model(parse_hf_config(config), torch.float32, "cpu", False).load_weights(
            unpaired.items()
        )
