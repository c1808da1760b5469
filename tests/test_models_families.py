"""Every family through the whole engine: greedy tokens equal transformers'
generate, and the engine's paths (chunked prefill, the prefix cache,
preemption) give the same tokens as plain whole-prompt runs.

Gemma 3's sliding layers, Gemma 2's and Phi-3's (window 8) make these checks bite: prompts and
continuations run past the window, prefix-cache hits land on blocks the
window has left, and preempted requests recompute across it.
"""

from __future__ import annotations

import pytest
import torch

from sluice.loader.loaded_model import LoadedModel
from sluice.models.families.registry import build_model, describe_family, parse_hf_config
from sluice.models.gemma3 import Gemma3ForCausalLM
from sluice.models.gemma4 import Gemma4ForCausalLM
from sluice.models.llama import LlamaForCausalLM
from sluice.models.moe_decoder import MoeForCausalLM
from tests.engine_paths import (
    check_chunked_prefill_equals_whole_prompts,
    check_preemption_resumes_exactly,
    check_prefix_cache_hit_equals_cold,
    check_speculation_keeps_greedy_tokens,
)
from tests.model_factory import (
    GEMMA2_KIND,
    GEMMA3_KIND,
    GEMMA4_KIND,
    QWEN2_MOE_KIND,
    QWEN3_MOE_KIND,
    QWEN3_YARN_KIND,
    SMOLLM3_KIND,
    TinyModel,
    build_tiny_model,
    make_core,
)
from tests.model_runs import loaded_float32, random_prompts, run

FAMILY_KINDS = (
    "qwen3_tied", "qwen3_untied", GEMMA3_KIND, GEMMA2_KIND, "phi3_window", SMOLLM3_KIND,
    QWEN3_YARN_KIND, QWEN3_MOE_KIND, QWEN2_MOE_KIND, GEMMA4_KIND,
)  # fmt: skip
# Kinds whose layers (all, or Gemma's local ones) attend within a window of 8.
SLIDING_KINDS = (GEMMA3_KIND, "phi3_window", GEMMA4_KIND)


@pytest.fixture(scope="module", params=FAMILY_KINDS)
def tiny(request, tmp_path_factory) -> TinyModel:
    return build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def loaded(tiny: TinyModel) -> LoadedModel:
    return loaded_float32(tiny)


def test_each_architecture_gets_its_own_model_class(loaded):
    expected = Gemma3ForCausalLM if loaded.name in (GEMMA3_KIND, GEMMA2_KIND) else LlamaForCausalLM
    if loaded.name in (QWEN3_MOE_KIND, QWEN2_MOE_KIND):
        expected = MoeForCausalLM
    if loaded.name == GEMMA4_KIND:
        expected = Gemma4ForCausalLM
    assert type(loaded.model) is expected


def test_the_startup_note_names_the_family_and_what_it_cannot_use(loaded):
    note = describe_family(loaded.model_config)
    assert note.startswith(f"architecture {loaded.model_config.architecture}: ")
    if loaded.name == GEMMA2_KIND:
        assert "soft-capping runs every layer's attention on the torch path" in note
    elif loaded.name in SLIDING_KINDS:
        assert "sliding-window layers (window 8) attend on the torch path" in note
        assert "keep all their KV blocks" in note
        if loaded.name == GEMMA4_KIND:
            assert note.endswith(
                "not the native RoPE + K/V-write kernel; its last 2 layers attend over earlier "
                "layers' K/V and hold none of their own"
            )
    elif loaded.name in (QWEN3_MOE_KIND, QWEN2_MOE_KIND):
        assert note.endswith("not the fused native decode call nor int8 weights")
    else:
        assert note.endswith("every engine path")


def test_greedy_tokens_through_the_engine_match_transformers(loaded, tiny):
    prompts = random_prompts(3, seed=7)
    ours = run(make_core(loaded), prompts)
    for i, prompt in enumerate(prompts):
        assert ours[i] == (hf_greedy(tiny, prompt, 24), "length")


@torch.no_grad()
def hf_greedy(tiny: TinyModel, prompt: list[int], num_new: int) -> list[int]:
    """transformers' argmax token by token, EOS included (generate's
    min_new_tokens would mask it, which the engine's ignore_eos does not)."""
    ids = list(prompt)
    for _ in range(num_new):
        ids.append(int(tiny.hf_model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("budget", [7, 64])
def test_chunked_prefill_gives_the_same_tokens_as_whole_prompts(loaded, budget):
    check_chunked_prefill_equals_whole_prompts(loaded, budget)


def test_a_prefix_cache_hit_gives_the_same_tokens_and_logprobs(loaded):
    check_prefix_cache_hit_equals_cold(loaded)


def test_preempted_requests_resume_with_the_same_greedy_tokens(loaded):
    check_preemption_resumes_exactly(loaded, num_prompts=12, num_blocks=40)


def test_qwen3_with_heads_of_128_runs_bfloat16_native_kernels_near_float32(tmp_path):
    """Qwen3's real head size (128): the native prefill and RoPE + K/V kernels
    serve it in bfloat16, with the q/k norms applied before the RoPE kernel."""
    from tests.model_runs import PagedRunner, assert_close_to_scale, hf_logits

    tiny = build_tiny_model("qwen3_untied", tmp_path, head_dim=128)
    config = parse_hf_config(tiny.config_dict)
    model = build_model(config, torch.bfloat16, torch.device("cpu"), False)
    model.load_weights(tiny.weights())
    prompt = random_prompts(1, seed=5)[0]
    runner = PagedRunner(model)
    table: list[int] = []
    runner.step([prompt[:-3]], [0], [table])  # a prefill, then a chunk after cached context
    chunk = runner.step([prompt[-3:-1]], [len(prompt) - 3], [table])
    decode = runner.step([prompt[-1:]], [len(prompt) - 1], [table])
    reference = hf_logits(tiny, prompt)
    assert_close_to_scale(chunk, reference[-2:-1], 3e-2)
    assert_close_to_scale(decode, reference[-1:], 3e-2)


def test_speculation_gives_the_tokens_of_plain_decoding(loaded, tiny):
    check_speculation_keeps_greedy_tokens(loaded, tiny, lengths=(20, 45, 70))
