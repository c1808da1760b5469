"""Partial rotary (Phi-4-mini: partial_rotary_factor 0.75) against
transformers' Phi3 on tiny random weights: RoPE rotates the first 12 of the
16 dims of each q/k head and passes the last 4 through, alone
(`PHI3_PARTIAL_KIND`) and with LongRoPE, whose lists then hold 6 factors
(`PHI4_MINI_KIND`, as Phi-4-mini has both).

The native RoPE + K/V-write kernel rotates whole heads, so these models take
the torch rotation (`RopeAngles.rotate`) in every dtype; the startup line
says so. Tolerances as in test_models_longrope.py.
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import torch
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from sluice.errors import ModelLoadError
from sluice.loader.loaded_model import LoadedModel
from sluice.models.families.registry import describe_family, parse_hf_config
from sluice.models.llama import LlamaForCausalLM
from sluice.models.native.rope import rope_write_kv_kernel
from sluice.models.rope_norm import RopeAngles, rope_cos_sin
from tests.model_factory import (
    PHI3_PARTIAL_KIND,
    PHI4_MINI_KIND,
    TinyModel,
    build_tiny_model,
    load_tiny_llama,
    make_core,
)
from tests.model_runs import (
    GREEDY,
    PagedRunner,
    assert_close_to_scale,
    greedy,
    hf_logits,
    loaded_float32,
    prompt_logits,
    random_prompts,
    run,
    run_one_by_one,
)

HEAD_DIM, ROTARY_DIM = 16, 12
LONG_PROMPT = [(37 * i + 11) % 509 + 3 for i in range(40)]  # 40 > 16 original positions


@pytest.fixture(scope="module", params=[PHI3_PARTIAL_KIND, PHI4_MINI_KIND])
def tiny(request, tmp_path_factory) -> TinyModel:
    return build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


def test_the_config_reads_the_factor_wherever_the_file_puts_it(tiny):
    d = tiny.config_dict
    assert parse_hf_config(d).rotary_dim == ROTARY_DIM
    only_top = d | {"rope_parameters": {k: v for k, v in d["rope_parameters"].items()
                                        if k != "partial_rotary_factor"}}  # fmt: skip
    only_inside = {k: v for k, v in d.items() if k != "partial_rotary_factor"}
    # transformers < 5: rope_scaling beside a top-level rope_theta.
    old_layout = {k: v for k, v in only_top.items() if k != "rope_parameters"}
    old_layout |= {"rope_theta": 10000.0, "rope_scaling": d["rope_parameters"]}
    del old_layout["partial_rotary_factor"]
    for variant in (only_top, only_inside, old_layout):
        config = parse_hf_config(variant)
        assert (config.head_dim, config.rotary_dim) == (HEAD_DIM, ROTARY_DIM)
        assert config.has_partial_rotary


def test_the_config_refuses_what_it_cannot_rotate(tiny):
    d = tiny.config_dict

    def with_factor(factor) -> dict:  # where transformers 5 writes it: both places
        return d | {
            "partial_rotary_factor": factor,
            "rope_parameters": d["rope_parameters"] | {"partial_rotary_factor": factor},
        }

    with pytest.raises(ModelLoadError, match="even number"):
        parse_hf_config(with_factor(0.5625))  # 9 of 16 dims
    with pytest.raises(ModelLoadError, match="even number"):
        parse_hf_config(with_factor(1.5))
    with pytest.raises(ModelLoadError, match="must be a number"):
        parse_hf_config(with_factor("3/4"))
    llama = d | {"architectures": ["LlamaForCausalLM"], "rope_parameters": {"rope_theta": 1e4}}
    with pytest.raises(ModelLoadError, match="only Phi-3"):
        parse_hf_config(llama)


def test_rope_tables_cover_the_rotated_dims_as_transformers_does(tiny):
    config = parse_hf_config(tiny.config_dict)
    cos, sin = rope_cos_sin(config, torch.float32, "cpu")
    assert cos.shape == (config.max_position_embeddings, ROTARY_DIM // 2)
    positions = torch.arange(config.max_position_embeddings)[None]
    hf_cos, hf_sin = Phi3RotaryEmbedding(tiny.hf_model.config)(torch.zeros(1), positions)
    assert hf_cos.shape[-1] == ROTARY_DIM  # transformers' cat(freqs, freqs)
    torch.testing.assert_close(cos, hf_cos[0, :, : ROTARY_DIM // 2], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin[0, :, : ROTARY_DIM // 2], rtol=0, atol=1e-6)


@pytest.mark.parametrize("num_tokens", [3, 20])  # the few-token and the plain rotation
def test_rotation_leaves_the_pass_through_dims_untouched(num_tokens):
    cos_table, sin_table = torch.randn(64, ROTARY_DIM // 2), torch.randn(64, ROTARY_DIM // 2)
    x = torch.randn(num_tokens, 3, HEAD_DIM)  # [T, H, D]
    angles = RopeAngles.at(cos_table, sin_table, torch.arange(num_tokens) * 2)
    rotated = angles.rotate(x)
    assert torch.equal(rotated[..., ROTARY_DIM:], x[..., ROTARY_DIM:])
    whole = RopeAngles.at(cos_table, sin_table, torch.arange(num_tokens) * 2, True)
    torch.testing.assert_close(rotated[..., :ROTARY_DIM], whole.rotate(x[..., :ROTARY_DIM]))
    assert not torch.allclose(rotated[..., :ROTARY_DIM], x[..., :ROTARY_DIM])


def test_prefill_logits_match_transformers(tiny):
    assert_close_to_scale(prompt_logits(load_tiny_llama(tiny), LONG_PROMPT),
                          hf_logits(tiny, LONG_PROMPT), 1e-4)  # fmt: skip


def test_rotating_the_pass_through_dims_breaks_the_parity(tmp_path):
    """A whole-head rotation over the same 6 frequencies plus 2 more (what a
    kernel that ignored rotary_dim would run) lands far from transformers."""
    tiny = build_tiny_model(PHI3_PARTIAL_KIND, tmp_path)
    whole = load_tiny_llama(tiny, rotary_dim=HEAD_DIM)
    reference = hf_logits(tiny, LONG_PROMPT)
    diff = (prompt_logits(whole, LONG_PROMPT) - reference).abs().max().item()
    assert diff > 1e-2 * reference.abs().max().item()


def test_greedy_decode_matches_transformers_generate(tiny):
    ours = greedy(PagedRunner(load_tiny_llama(tiny)), LONG_PROMPT, 16)
    with torch.no_grad():
        generated = tiny.hf_model.generate(
            torch.tensor([LONG_PROMPT]), do_sample=False, max_new_tokens=16,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    assert ours == generated[0, len(LONG_PROMPT) :].tolist()


def test_bfloat16_takes_the_torch_rotation_and_stays_near_transformers(tiny):
    model = load_tiny_llama(tiny, torch.bfloat16)
    assert not model.native_rope
    assert all(layer.rope_write_kv is None for layer in model.layers)
    # Only the partial rotary keeps the kernel off: whole heads of the same
    # shapes get it wherever it is built.
    whole_head = LlamaForCausalLM(
        dataclasses.replace(model.config, rotary_dim=HEAD_DIM, rope_scaling=None),
        torch.bfloat16,
        "cpu",
    )
    assert whole_head.native_rope == (rope_write_kv_kernel(torch.bfloat16) is not None)
    assert_close_to_scale(prompt_logits(model, LONG_PROMPT), hf_logits(tiny, LONG_PROMPT), 5e-2)


def test_the_startup_note_says_rope_runs_on_the_torch_path(tiny):
    note = describe_family(parse_hf_config(tiny.config_dict))
    assert note == (
        "architecture Phi3ForCausalLM: partial rotary (RoPE on 12 of 16 dims per head) "
        "rotates q and k on the torch path, not the native RoPE + K/V-write kernel"
    )


@pytest.fixture(scope="module")
def loaded(tiny: TinyModel) -> LoadedModel:
    return loaded_float32(tiny)


def test_chunked_prefill_gives_the_same_tokens_as_whole_prompts(loaded):
    prompts = random_prompts(6, seed=2)
    chunked = run(make_core(loaded, budget=16), prompts)
    assert chunked == run(make_core(loaded, budget=512, chunked=False), prompts)


def test_a_prefix_cache_hit_gives_the_same_tokens_and_logprobs(loaded):
    base = random_prompts(1, seed=11)[0] * 2
    prompts = [base, base, base + [1]]
    params = msgspec.structs.replace(GREEDY, logprobs=2, max_tokens=8)
    cached = run_one_by_one(make_core(loaded), prompts, params)
    plain = run_one_by_one(make_core(loaded, prefix_caching=False), prompts, params)
    assert [c for _, _, c in cached][1:] == [(len(base) - 1) // 4 * 4, len(base) // 4 * 4]
    for (tokens, logprobs, _), (want_tokens, want_logprobs, _) in zip(cached, plain, strict=True):
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want_logprobs, abs=1e-5)
