"""Gemma 3 (text) against transformers' Gemma3ForCausalLM on the same tiny random weights.

The tiny model (tests/model_factory.py) has a sliding layer of window 8, a
global layer and a second sliding layer, a query scalar (24) other than
head_dim (16), its two RoPE bases and logit soft-capping at 5: the 13-token
prompt and 32-token continuations run far past the window, so a layer that
attended beyond it, a norm without its (1 + weight), an unscaled embedding or
a missing cap would each move the logits by far more than the tolerance
(the reasoning of test_models_llama.py: float32, 1e-4 of the logit scale).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sluice.models.families.registry import parse_hf_config
from sluice.models.gemma3 import Gemma3ForCausalLM
from tests.model_factory import (
    GEMMA2_KIND,
    GEMMA3_KIND,
    GEMMA3_SLIDING_WINDOW,
    TinyModel,
    build_tiny_model,
)
from tests.model_runs import PagedRunner, assert_close_to_scale, greedy, hf_logits

PROMPT = [1, 17, 300, 45, 9, 88, 211, 5, 402, 77, 3, 150, 64]
NUM_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_model(GEMMA3_KIND, tmp_path_factory.mktemp(GEMMA3_KIND))


def load_ours(tiny: TinyModel, dtype=torch.float32, batch_invariant=False) -> Gemma3ForCausalLM:
    config = parse_hf_config(tiny.config_dict)
    model = Gemma3ForCausalLM(config, dtype, "cpu", batch_invariant)
    model.load_weights(tiny.weights())
    return model


def test_the_config_keeps_gemmas_window_layers_scalar_and_cap(tiny):
    config = parse_hf_config(tiny.config_dict)
    assert config.qk_norm and config.norm_offset == 1.0
    assert config.embedding_scale == config.hidden_size**0.5
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert config.sliding_window == GEMMA3_SLIDING_WINDOW
    assert (config.rope_theta, config.rope_local_theta) == (1e6, 10000.0)
    assert config.attention_scale == 24**-0.5
    assert config.final_logit_softcapping == 5.0
    assert config.hidden_act == "gelu_pytorch_tanh"


def test_prompt_logits_match_transformers_at_every_position(tiny):
    runner = PagedRunner(load_ours(tiny))
    tables = [[]]
    ours = torch.cat([runner.step([[t]], [i], tables) for i, t in enumerate(PROMPT)])
    assert_close_to_scale(ours, hf_logits(tiny, PROMPT), 1e-4)


def test_a_whole_prompt_prefill_matches_transformers(tiny):
    model = load_ours(tiny)
    runner = PagedRunner(model)
    for cut in (1, 5, len(PROMPT) - 1):  # prefix cut, then the rest as one chunk
        table: list[int] = []
        runner.step([PROMPT[:cut]], [0], [table])
        last = runner.step([PROMPT[cut:]], [cut], [table])[0]
        assert_close_to_scale(last, hf_logits(tiny, PROMPT)[-1], 1e-4)


def test_greedy_continuation_past_the_window_matches_transformers_generate(tiny):
    ours = greedy(PagedRunner(load_ours(tiny)), PROMPT, NUM_NEW_TOKENS)
    expected = tiny.hf_model.generate(
        torch.tensor([PROMPT]), do_sample=False, max_new_tokens=NUM_NEW_TOKENS,
        min_new_tokens=NUM_NEW_TOKENS, pad_token_id=0,
    )[0, len(PROMPT) :].tolist()  # fmt: skip
    assert ours == expected


def test_without_the_window_the_logits_would_differ(tiny):
    """The parity above sees the window: attending to everything moves the logits."""
    config = dataclasses.replace(parse_hf_config(tiny.config_dict), sliding_window=10_000)
    model = Gemma3ForCausalLM(config, torch.float32, "cpu")
    model.load_weights(tiny.weights())
    logits = PagedRunner(model).step([PROMPT], [0], [[]])[0]
    reference = hf_logits(tiny, PROMPT)[-1]
    assert (logits - reference).abs().max() > 1e-2 * reference.abs().max()


def test_soft_capping_bounds_every_logit_by_the_cap(tiny):
    logits = PagedRunner(load_ours(tiny)).step([PROMPT], [0], [[]])
    assert logits.abs().max() < 5.0


def test_bfloat16_model_stays_near_float32(tiny):
    ours = PagedRunner(load_ours(tiny, torch.bfloat16)).step([PROMPT], [0], [[]])
    assert_close_to_scale(ours, hf_logits(tiny, PROMPT)[-1:], 5e-2)


def test_batch_invariant_mode_gives_the_same_bits_in_any_chunking(tiny):
    model = load_ours(tiny, torch.bfloat16, batch_invariant=True)
    runner = PagedRunner(model)
    whole = runner.step([PROMPT], [0], [[]])[0]
    table: list[int] = []
    runner.step([PROMPT[:6]], [0], [table])
    runner.step([PROMPT[6:9], [5, 6]], [6, 0], [table, []])
    chunked = runner.step([PROMPT[9:]], [9], [table])[0]
    assert torch.equal(whole, chunked)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_only_int8_serves_gemma_within_its_rounding(tiny, dtype):
    """Every decoder matrix of every layer kind takes the int8 copy (measured
    5% of the logit scale on these random weights, in prefill and decode)."""
    model = load_ours(tiny, dtype)
    model.quantize("int8")
    assert model.quantization == "int8"
    runner = PagedRunner(model)
    table: list[int] = []
    runner.step([PROMPT[:-1]], [0], [table])
    decoded = runner.step([PROMPT[-1:]], [len(PROMPT) - 1], [table])
    assert_close_to_scale(decoded, hf_logits(tiny, PROMPT)[-1:], 0.1)


@pytest.fixture(scope="module")
def tiny_gemma2(tmp_path_factory) -> TinyModel:
    return build_tiny_model(GEMMA2_KIND, tmp_path_factory.mktemp(GEMMA2_KIND))


def test_gemma2_prompt_logits_match_transformers_and_need_the_attention_cap(tiny_gemma2):
    """Gemma 2: no q/k norms, sliding and global layers in turn, scores capped
    at 1.0 before the softmax on both kinds of layer."""
    config = parse_hf_config(tiny_gemma2.config_dict)
    assert not config.qk_norm and config.attn_logit_softcapping == 1.0
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    reference = hf_logits(tiny_gemma2, PROMPT)
    for cap, should_match in ((1.0, True), (None, False)):
        model = Gemma3ForCausalLM(
            dataclasses.replace(config, attn_logit_softcapping=cap), torch.float32, "cpu"
        )
        model.load_weights(tiny_gemma2.weights())
        ours = PagedRunner(model).step([PROMPT], [0], [[]])  # the last position's logits
        diff = (ours - reference[-1:]).abs().max() / reference.abs().max()
        assert bool(diff <= 1e-4) is should_match, f"cap {cap}: relative diff {diff:.2g}"
