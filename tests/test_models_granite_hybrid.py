"""Granite 4.0-H (sluice/models/granite_hybrid.py, mamba2.py, mamba2_scan.py):
tiny random models, dense and with experts, built here from transformers'
GraniteMoeHybridConfig. Their logits and greedy tokens are transformers', and
every engine path over the per-sequence Mamba states (chunked prefill at
several budgets, a prefix-cache hit through the block snapshots, preemption,
speculation with rolled-back drafts, a row among others) gives the bits of
plain whole-prompt runs."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import msgspec
import pytest
import torch

from sluice.cli import main
from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader.choices import cpu_flags
from sluice.loader.loaded_model import LoadedModel, load_model
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.families.registry import build_model, describe_family, parse_hf_config
from sluice.models.granite_hybrid import GraniteHybridForCausalLM, GraniteMambaLayer
from sluice.models.mamba2_scan import _sum_last
from tests.granite_files import DENSE, MOE, build_tiny_granite
from tests.model_factory import TinyModel, make_core, write_tiny_tokenizer
from tests.model_runs import (
    GREEDY,
    PagedRunner,
    assert_close_to_scale,
    hf_logits,
    loaded_float32,
    random_prompts,
    run,
    run_one_by_one,
)
from tests.speculation_runs import ngram, repeating_prompt
from tests.speculation_runs import run as run_with_logprobs


@pytest.fixture(scope="module", params=[DENSE, MOE])
def tiny(request, tmp_path_factory) -> TinyModel:
    return build_tiny_granite(request.param, tmp_path_factory.mktemp(f"granite_{request.param}"))


@pytest.fixture(scope="module")
def loaded(tiny: TinyModel) -> LoadedModel:
    return loaded_float32(tiny)


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> TinyModel:
    return build_tiny_granite(DENSE, tmp_path_factory.mktemp("granite_dense"))


@pytest.fixture(scope="module")
def invariant(dense: TinyModel) -> LoadedModel:
    """The dense model batch-invariant (every matmul and activation on fixed
    row tiles), on which a row's bits may not depend on its step."""
    return _invariant(dense)


def _invariant(tiny: TinyModel) -> LoadedModel:
    loaded = loaded_float32(tiny)
    model = build_model(loaded.model_config, torch.float32, torch.device("cpu"), True)
    model.load_weights(tiny.weights())
    return replace(loaded, model=model)


def test_mamba_layers_get_the_mixer_and_the_startup_line_says_so(loaded, tiny):
    assert type(loaded.model) is GraniteHybridForCausalLM
    kinds = [isinstance(layer, GraniteMambaLayer) for layer in loaded.model.layers]
    assert kinds == [True, False, True, True]
    config = loaded.model_config
    assert config.nope_layers == (1,)
    assert (config.num_experts == 8) == tiny.kind.endswith(MOE)
    note = describe_family(config)
    assert "3 of its 4 layers are Mamba-2 mixers over a per-sequence float32 state" in note


def test_logits_of_a_prefill_a_chunk_and_a_decode_match_transformers(loaded, tiny):
    prompt = random_prompts(1, seed=5)[0] + [9, 10, 11]
    runner = PagedRunner(loaded.model)
    table: list[int] = []
    first = runner.step([prompt[:-3]], [0], [table])
    chunk = runner.step([prompt[-3:-1]], [len(prompt) - 3], [table])  # the states carried
    decode = runner.step([prompt[-1:]], [len(prompt) - 1], [table])
    with torch.no_grad():
        reference = hf_logits(tiny, prompt)
    assert_close_to_scale(first, reference[-4:-3], 1e-5)
    assert_close_to_scale(chunk, reference[-2:-1], 1e-5)
    assert_close_to_scale(decode, reference[-1:], 1e-5)


def test_granite_4_micro_all_attention_with_rope_matches_transformers(tmp_path):
    """Granite 4.0 Micro (not -H) is the same architecture with every layer
    attending: no state, RoPE on, the scalings still applied."""
    changes = {"layer_types": ["attention"] * 4, "position_embedding_type": "rope"}
    tiny = build_tiny_granite(DENSE, tmp_path, **changes)
    loaded = loaded_float32(tiny)
    assert not loaded.model_config.has_sequence_state and not loaded.model_config.nope_layers
    prompt = random_prompts(1, seed=4)[0]
    logits = PagedRunner(loaded.model).step([prompt], [0], [[]])
    with torch.no_grad():
        assert_close_to_scale(logits, hf_logits(tiny, prompt)[-1:], 1e-5)


def test_greedy_tokens_through_the_engine_match_transformers_generate(loaded, tiny):
    prompts = random_prompts(3, seed=7)
    ours = run(make_core(loaded), prompts)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            generated = tiny.hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24
            )[0]
        assert ours[i] == (generated[len(prompt) :].tolist(), "length")


_LOGPROBS = msgspec.structs.replace(GREEDY, logprobs=2, max_tokens=8)


@pytest.mark.parametrize("budget", [7, 64])
def test_chunked_prefill_is_bitwise_the_whole_prompt_run(invariant, budget):
    """Tokens and logprobs, bit for bit: the state carried between chunks is
    the value the next token would have seen in one shot."""
    _check_chunked_prefill(invariant, budget)


def test_chunked_prefill_with_experts_is_bitwise_the_whole_prompt_run(tmp_path):
    _check_chunked_prefill(_invariant(build_tiny_granite(MOE, tmp_path)), 7)


def _check_chunked_prefill(invariant: LoadedModel, budget: int) -> None:
    prompts = random_prompts(4, seed=2)
    chunked = run_with_logprobs(make_core(invariant, budget=budget), prompts, _LOGPROBS)
    whole = run_with_logprobs(make_core(invariant, budget=512, chunked=False), prompts, _LOGPROBS)
    assert {i: r[:3] for i, r in chunked.items()} == {i: r[:3] for i, r in whole.items()}


def test_a_row_has_the_same_bits_alone_and_among_others(invariant):
    prompts = random_prompts(5, seed=12)
    crowd = run_with_logprobs(make_core(invariant), prompts, _LOGPROBS)
    alone = run_one_by_one(make_core(invariant, prefix_caching=False), prompts, _LOGPROBS)
    assert [(tokens, logprobs) for tokens, _, logprobs, _ in crowd.values()] == [
        (tokens, logprobs) for tokens, logprobs, _ in alone
    ]


def test_a_prefix_cache_hit_starts_from_the_snapshot_with_the_cold_bits(invariant):
    """Blocks of 32 tokens: a snapshot (31.5 KiB) then costs no more than the
    block's K/V would in an all-attention model, so prefix caching stays on."""
    base = (random_prompts(1, seed=11)[0] * 40)[:100]
    prompts = [base, base, base[:70] + [7, 8, 9], base + [1]]
    cached = run_one_by_one(make_core(invariant, block_size=32), prompts, _LOGPROBS)
    cold = run_one_by_one(make_core(invariant, prefix_caching=False), prompts, _LOGPROBS)
    assert [c for _, _, c in cached][1:] == [96, 64, 96]
    assert [(t, lp) for t, lp, _ in cached] == [(t, lp) for t, lp, _ in cold]


def test_preempted_requests_resume_with_the_same_greedy_tokens(invariant):
    loaded = invariant
    prompts = random_prompts(6, seed=3)
    params = msgspec.structs.replace(GREEDY, max_tokens=12)
    roomy = run(make_core(loaded, num_blocks=512), prompts, params)
    core = make_core(replace(loaded, max_model_len=128), num_blocks=8, block_size=32)
    assert run(core, prompts, params) == roomy
    assert core.scheduler.num_preemptions > 0
    assert core.scheduler.states is not None
    assert core.scheduler.states.num_free_slots == core.scheduler.states.num_slots


def test_speculation_rolls_rejected_drafts_out_of_the_state(invariant):
    """Some drafts are rejected, so states roll back, and no token or logprob changes."""
    rng = random.Random(5)
    prompts = [repeating_prompt(rng, length) for length in (20, 45)]
    speculating = make_core(invariant, speculative=ngram(k=4))
    assert speculating.speculator is not None
    drafted = run_with_logprobs(speculating, prompts, _LOGPROBS)
    plain = run_with_logprobs(make_core(invariant), prompts, _LOGPROBS)
    assert {i: r[:3] for i, r in drafted.items()} == {i: r[:3] for i, r in plain.items()}
    counters = speculating.speculator.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens


def test_a_block_costs_its_kv_and_one_state_snapshot_of_each_mamba_layer(invariant):
    loaded = invariant
    """Per Mamba layer: the conv tail (3 x (128 + 2 x 2 x 16)) and the SSM
    state (8 x 16 x 16), in float32."""
    config = loaded.model_config
    with_snapshots = kv_cache_bytes_per_block(config, 4, torch.float32)
    without = kv_cache_bytes_per_block(config, 4, torch.float32, with_snapshots=False)
    assert without == 2 * 4 * 2 * 16 * 4  # the attention layer's K and V
    assert with_snapshots - without == 3 * (3 * 192 + 8 * 16 * 16) * 4
    core = make_core(loaded, prefix_caching=False, max_seqs=5)
    assert [c.shape for c in core.runner.kv_caches if c.dim() == 2] == [(5, 2624)] * 3


def test_the_halving_sum_is_the_sum_and_ignores_the_leading_rows():
    values = torch.randn(7, 3, 13, dtype=torch.float64)
    assert torch.allclose(_sum_last(values), values.sum(-1))
    single = torch.randn(1, 5, 16)
    stacked = torch.cat([single, torch.randn(40, 5, 16)])
    assert torch.equal(_sum_last(stacked)[:1], _sum_last(single))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["mamba", "conv", "mamba", "mamba"]},
         "unsupported Granite 4.0-H layer type 'conv'"),
        ({"mamba_d_conv": 1}, "unsupported mamba_d_conv 1"),
        ({"mamba_d_state": 0}, "unsupported mamba_d_state 0"),
        ({"mamba_n_heads": 7}, "unsupported Mamba shape: 7 heads of 16"),
        ({"mamba_n_groups": 3}, "unsupported mamba_n_groups 3 for 8 heads"),
        ({"layer_types": ["mamba"]}, "layer_types names 1 layers, the model has 4"),
        ({"residual_multiplier": "big"}, "'residual_multiplier' must be a positive number"),
    ],
)  # fmt: skip
def test_a_layer_type_or_state_shape_it_cannot_run_is_one_line(tiny, change, message):
    with pytest.raises(ModelLoadError, match=message):
        parse_hf_config(tiny.config_dict | change)


def test_sluice_serve_refuses_a_layer_type_it_cannot_run_with_exit_status_2(tiny, tmp_path, capsys):
    config = tiny.config_dict | {"layer_types": ["mamba", "attention", "rwkv", "mamba"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tiny_tokenizer(tmp_path, num_tokens=512)
    status = main(["serve", "--model", str(tmp_path), "--port", "0", "--in-process"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert "unsupported Granite 4.0-H layer type 'rwkv'" in err


@pytest.mark.slow
def test_the_default_path_gives_the_same_bits_chunked_cached_and_speculating(dense, tmp_path):
    """As `sluice serve` loads it: bfloat16 with the row-invariant int8 matmuls
    (where the CPU has AVX512-VNNI), speculation on. A row's bits ignore its
    step, so chunking, prefix hits and verified drafts change no token or logprob."""
    write_tiny_tokenizer(dense.path, num_tokens=512)
    default = load_model(ModelConfig(model=str(dense.path), cache_dir=tmp_path))
    if "avx512_vnni" not in cpu_flags():
        pytest.skip("the row-invariant default needs AVX512-VNNI")
    assert default.choices.row_invariant
    prompts = random_prompts(4, seed=2)
    whole = run_with_logprobs(make_core(default, budget=512, chunked=False), prompts, _LOGPROBS)
    for core in (make_core(default, budget=7), make_core(default, block_size=32)):
        assert {i: r[:3] for i, r in run_with_logprobs(core, prompts, _LOGPROBS).items()} == {
            i: r[:3] for i, r in whole.items()
        }
    rng = random.Random(5)
    repeating = [repeating_prompt(rng, length) for length in (20, 45)]
    speculating = make_core(default, speculative=ngram(k=4))
    drafted = run_with_logprobs(speculating, repeating, _LOGPROBS)
    plain = run_with_logprobs(make_core(default), repeating, _LOGPROBS)
    # Whether drafts are proposed here follows the step costs measured at load
    # (test_speculation_rolls_rejected_drafts_out_of_the_state checks they roll back).
    assert {i: r[:3] for i, r in drafted.items()} == {i: r[:3] for i, r in plain.items()}
