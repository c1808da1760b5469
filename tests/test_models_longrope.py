"""LongRoPE (Phi-3.5-mini, Phi-4-mini's scaling) against transformers' Phi3 on
tiny random weights, float32, in both regimes: a context up to the original
16 positions (the short factors) and one past it (the long factors).

transformers picks the list per forward call by the prompt's length; sluice
picks once per server by the served context (sluice/models/longrope.py), so
each parity check below serves the context whose list transformers uses for
that prompt. Tolerance as in test_models_llama.py (1e-4 of the logit scale);
the wrong list moves logits by far more (checked below).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from sluice.config import ModelConfig
from sluice.loader.loaded_model import load_model
from sluice.models import longrope
from sluice.models.families.registry import parse_hf_config
from sluice.models.llama import LlamaForCausalLM
from sluice.models.rope_norm import rope_cos_sin
from tests.model_factory import (
    PHI3_LONGROPE_KIND,
    PHI3_LONGROPE_ORIGINAL,
    TinyModel,
    build_tiny_model,
    write_tiny_tokenizer,
)
from tests.model_runs import (
    PagedRunner,
    assert_close_to_scale,
    greedy,
    hf_logits,
    prompt_logits,
)

SHORT_PROMPT = [1, 17, 300, 45, 9, 88, 211, 5, 402, 77, 3, 150, 64]  # 13 <= 16 positions
LONG_PROMPT = [(37 * i + 11) % 509 + 3 for i in range(40)]  # 40 > 16 positions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_model(PHI3_LONGROPE_KIND, tmp_path_factory.mktemp(PHI3_LONGROPE_KIND))


def load_ours(tiny: TinyModel, max_model_len: int) -> LlamaForCausalLM:
    config = parse_hf_config(tiny.config_dict)
    fitted = longrope.fit_to_context(config.rope_scaling, max_model_len)
    model = LlamaForCausalLM(dataclasses.replace(config, rope_scaling=fitted), torch.float32, "cpu")
    model.load_weights(tiny.weights())
    return model


def test_the_config_reads_both_lists_and_transformers_attention_factor(tiny):
    scaling = parse_hf_config(tiny.config_dict).rope_scaling
    assert scaling["original_max_position_embeddings"] == PHI3_LONGROPE_ORIGINAL
    # factor 256 / 16: sqrt(1 + ln 16 / ln 16), what transformers computed.
    assert scaling["attention_factor"] == pytest.approx(math.sqrt(2.0))
    assert scaling["attention_factor"] == pytest.approx(
        tiny.hf_model.model.rotary_emb.attention_scaling
    )
    # The model's own context (256) is past the original one: the long list.
    assert scaling["uses_long_factor"]


@pytest.mark.parametrize("served_len", [PHI3_LONGROPE_ORIGINAL, 256])
def test_rope_tables_equal_transformers_phi3_rotary_embedding(tiny, served_len):
    config = parse_hf_config(tiny.config_dict)
    fitted = longrope.fit_to_context(config.rope_scaling, served_len)
    cos, sin = rope_cos_sin(dataclasses.replace(config, rope_scaling=fitted), torch.float32, "cpu")
    # transformers picks the list by the longest position it is given.
    positions = torch.arange(served_len)[None]
    hf_cos, hf_sin = Phi3RotaryEmbedding(tiny.hf_model.config)(torch.zeros(1), positions)
    half = cos.shape[1]
    torch.testing.assert_close(cos[:served_len], hf_cos[0, :, :half], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[:served_len], hf_sin[0, :, :half], rtol=0, atol=1e-6)


def test_a_short_context_uses_the_short_factors_as_transformers_does_on_a_short_prompt(tiny):
    ours = prompt_logits(load_ours(tiny, PHI3_LONGROPE_ORIGINAL), SHORT_PROMPT)
    assert_close_to_scale(ours, hf_logits(tiny, SHORT_PROMPT), 1e-4)


def test_a_long_context_uses_the_long_factors_as_transformers_does_on_a_long_prompt(tiny):
    ours = prompt_logits(load_ours(tiny, 256), LONG_PROMPT)
    assert_close_to_scale(ours, hf_logits(tiny, LONG_PROMPT), 1e-4)


def test_bfloat16_stays_near_transformers_past_the_original_length(tiny):
    config = parse_hf_config(tiny.config_dict)
    model = LlamaForCausalLM(config, torch.bfloat16, "cpu")  # the long list: context 256
    model.load_weights(tiny.weights())
    # bfloat16's 8 mantissa bits over two layers: a few percent of the logit scale
    # (test_models_llama.py); the native RoPE kernel reads the same scaled tables.
    assert_close_to_scale(prompt_logits(model, LONG_PROMPT), hf_logits(tiny, LONG_PROMPT), 5e-2)


def test_the_factor_list_is_what_makes_each_parity_hold(tiny):
    reference = hf_logits(tiny, SHORT_PROMPT)
    long_listed = prompt_logits(load_ours(tiny, 256), SHORT_PROMPT)
    scale = reference.abs().max().item()
    assert (long_listed - reference).abs().max().item() > 1e-2 * scale


def test_greedy_decode_past_the_original_length_matches_transformers_generate(tiny):
    ours = greedy(PagedRunner(load_ours(tiny, 256)), LONG_PROMPT, 16)
    with torch.no_grad():
        generated = tiny.hf_model.generate(
            torch.tensor([LONG_PROMPT]),
            do_sample=False,
            max_new_tokens=16,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert ours == generated[0, len(LONG_PROMPT) :].tolist()


def test_the_loader_fits_the_list_to_max_model_len_and_says_which(tiny):
    write_tiny_tokenizer(tiny.path, num_tokens=512)
    config = ModelConfig(
        model=str(tiny.path), dtype="float32", quantization=None, activation_quantization=None
    )
    short = load_model(dataclasses.replace(config, max_model_len=PHI3_LONGROPE_ORIGINAL))
    assert not short.model_config.rope_scaling["uses_long_factor"]
    assert "LongRoPE: short factors" in short.choices.reason
    assert_close_to_scale(
        prompt_logits(short.model, SHORT_PROMPT), hf_logits(tiny, SHORT_PROMPT), 1e-4
    )
    served_whole = load_model(config)
    assert "LongRoPE: long factors" in served_whole.choices.reason
