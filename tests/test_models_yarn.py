"""YaRN rope scaling (sluice/models/yarn.py) against transformers.

Tiny random Llama and Qwen3 models scaled by YaRN over an original context
of 16 positions (factor 16): the cos/sin tables equal transformers' rotary
embedding, the logits of a 45-token prompt (past the original context)
equal transformers' within 1e-4 of the logit scale (tolerance as in
test_models_llama.py), greedy decode equals `generate`, and the same
weights without the scaling do not match (the scaling is what the parity
rests on). The parser computes the attention factor as
`_compute_yarn_parameters` does, from each of its inputs.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from sluice.errors import ModelLoadError
from sluice.models.families.registry import parse_hf_config
from sluice.models.rope_norm import rope_cos_sin
from tests.model_factory import (
    LLAMA_YARN_KIND,
    QWEN3_YARN_KIND,
    YARN_ORIGINAL,
    TinyModel,
    build_tiny_model,
    load_tiny_llama,
    tiny_hf_config,
)
from tests.model_runs import PagedRunner, assert_close_to_scale, greedy, hf_logits, prompt_logits

PROMPT = [(7 * i + 3) % 509 + 3 for i in range(45)]
ROTARY = {LLAMA_YARN_KIND: LlamaRotaryEmbedding, QWEN3_YARN_KIND: Qwen3RotaryEmbedding}
ARCHITECTURES = {LLAMA_YARN_KIND: "LlamaForCausalLM", QWEN3_YARN_KIND: "Qwen3ForCausalLM"}
BASE = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 8, "hidden_size": 64,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "max_position_embeddings": 4096, "rope_theta": 1e6,
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(ROTARY))
def tiny(request, tmp_path_factory) -> TinyModel:
    return build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


def test_prompt_runs_past_the_original_context():
    assert len(PROMPT) > 2 * YARN_ORIGINAL


@pytest.mark.parametrize("kind", sorted(ROTARY))
def test_rope_tables_equal_transformers_yarn_rotary_embedding(kind):
    hf_config = tiny_hf_config(kind)
    config = parse_hf_config(hf_config.to_dict() | {"architectures": [ARCHITECTURES[kind]]})
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "yarn"
    cos, sin = rope_cos_sin(config, torch.float32, "cpu")
    positions = torch.arange(config.max_position_embeddings)[None]
    hf_cos, hf_sin = ROTARY[kind](hf_config)(torch.zeros(1), positions)
    half = config.head_dim // 2
    torch.testing.assert_close(cos, hf_cos[0, :, :half], atol=0, rtol=0)
    torch.testing.assert_close(sin, hf_sin[0, :, :half], atol=0, rtol=0)


def test_prompt_logits_past_the_original_context_match_transformers(tiny):
    logits = prompt_logits(load_tiny_llama(tiny), PROMPT)
    assert_close_to_scale(logits, hf_logits(tiny, PROMPT), 1e-4)


def test_without_the_scaling_the_same_weights_do_not_match(tiny):
    logits = prompt_logits(load_tiny_llama(tiny, rope_scaling=None), PROMPT)
    reference = hf_logits(tiny, PROMPT)
    assert (logits - reference).abs().max() > 1e-2 * reference.abs().max()


def test_greedy_decode_past_the_original_context_equals_generate(tiny):
    ours = greedy(PagedRunner(load_tiny_llama(tiny)), PROMPT[:20], 24)
    with torch.no_grad():
        generated = tiny.hf_model.generate(
            torch.tensor([PROMPT[:20]]), do_sample=False, max_new_tokens=24,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    assert ours == generated[0, 20:].tolist()


def test_bfloat16_on_the_native_rope_kernel_stays_near_float32(tiny):
    reference = prompt_logits(load_tiny_llama(tiny), PROMPT)
    bf16 = prompt_logits(load_tiny_llama(tiny, torch.bfloat16), PROMPT)
    assert_close_to_scale(bf16, reference, 5e-2)


def yarn(**scaling) -> dict:
    config = parse_hf_config(BASE | {"rope_scaling": {"rope_type": "yarn", **scaling}})
    assert config.rope_scaling is not None
    return config.rope_scaling


def test_attention_factor_defaults_to_one_tenth_log_factor_plus_one():
    scaling = yarn(factor=4.0, original_max_position_embeddings=1024)
    assert scaling["attention_factor"] == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert (scaling["beta_fast"], scaling["beta_slow"], scaling["truncate"]) == (32.0, 1.0, True)


def test_a_given_attention_factor_wins_and_mscale_pairs_give_their_ratio():
    assert yarn(factor=4.0, attention_factor=0.5)["attention_factor"] == 0.5
    scaling = yarn(factor=40.0, mscale=1.0, mscale_all_dim=0.707)
    want = (0.1 * math.log(40.0) + 1.0) / (0.1 * 0.707 * math.log(40.0) + 1.0)
    assert scaling["attention_factor"] == pytest.approx(want)


def test_original_context_beside_the_scaling_wins_and_defaults_to_the_model_context():
    raw = BASE | {"original_max_position_embeddings": 512}
    raw["rope_scaling"] = {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
    }
    scaling = parse_hf_config(raw).rope_scaling
    assert scaling is not None and scaling["original_max_position_embeddings"] == 512
    assert yarn(factor=2.0)["original_max_position_embeddings"] == 4096


def test_a_missing_factor_is_the_ratio_of_the_two_contexts():
    assert yarn(original_max_position_embeddings=1024)["factor"] == 4.0


def test_a_non_numeric_parameter_is_one_line_naming_it():
    with pytest.raises(ModelLoadError, match="'beta_fast'"):
        yarn(factor=4.0, beta_fast="fast")


def test_yarn_reads_from_transformers_5_rope_parameters_too():
    raw = dict(BASE)
    raw.pop("rope_theta")
    raw["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                              "original_max_position_embeddings": 1024}  # fmt: skip
    config = parse_hf_config(raw)
    assert config.rope_theta == 1e6 and config.rope_scaling is not None
    assert config.rope_scaling == yarn(factor=4.0, original_max_position_embeddings=1024)
