"""Prompt logprobs (vLLM's `prompt_logprobs`, and completions' echo + logprobs):
the engine's, over chunked prefill and past the prefix cache, against
transformers' log-likelihoods of the embedded model (float32 on both sides)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from sluice.config import CacheConfig, EngineConfig, SchedulerConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.outputs import RequestDelta
from sluice.engine.sampling_params import SamplingParams
from sluice.loader import load_model

pytestmark = pytest.mark.slow

# Both sides compute in float32 in different orders (test_embedded_parity.py
# measures logits within 7.4e-5); a log-softmax adds no more than that again.
LOGPROB_ATOL = 1e-3
TEXT = "The quick brown fox jumps over the lazy dog. It was a sunny day in the park, and"
NUM_TOP = 3


@pytest.fixture(scope="module")
def loaded(embedded_model_config):
    return load_model(embedded_model_config)


@pytest.fixture(scope="module")
def prompt(loaded) -> list[int]:
    return loaded.tokenizer.encode(TEXT)


@pytest.fixture(scope="module")
def reference(embedded_model_dir, prompt) -> torch.Tensor:
    """transformers' log p(token i | tokens before), [len(prompt) - 1, vocab]."""
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()  # [len, vocab]
    return logits[:-1].log_softmax(dim=-1)


def engine(loaded, max_num_batched_tokens: int) -> EngineCore:
    scheduler = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens)
    cache = CacheConfig(kv_cache_memory_bytes=400 << 20)
    return EngineCore(EngineConfig(cache=cache, scheduler=scheduler, multiprocess=False), loaded)


def run(core: EngineCore, request_id: str, prompt: list[int], **params) -> list[RequestDelta]:
    core.add_request(
        generation_request(request_id, prompt, SamplingParams(temperature=0.0, **params))
    )
    deltas = []
    while core.has_unfinished_requests():
        deltas += [d for d in core.step() if d.request_id == request_id]
    return deltas


def check_against_reference(delta: RequestDelta, prompt: list[int], reference: torch.Tensor):
    lp = delta.prompt_logprobs
    assert lp is not None and len(lp.logprobs) == len(prompt) - 1
    expected = reference.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lp.logprobs).float(), expected, atol=LOGPROB_ATOL)
    top_logprobs, top_ids = reference.topk(NUM_TOP, dim=-1)
    assert [list(ids) for ids in lp.top_token_ids] == top_ids.tolist()
    assert torch.allclose(torch.tensor(lp.top_logprobs).float(), top_logprobs, atol=LOGPROB_ATOL)
    ranks = (reference > expected[:, None]).sum(dim=1) + 1
    assert list(lp.ranks) == ranks.tolist()


def test_prompt_logprobs_match_transformers_over_prefill_chunks(loaded, prompt, reference):
    core = engine(loaded, max_num_batched_tokens=7)  # the prompt takes several chunks
    deltas = run(core, "a", prompt, max_tokens=2, prompt_logprobs=NUM_TOP)
    check_against_reference(deltas[0], prompt, reference)
    assert all(delta.prompt_logprobs is None for delta in deltas[1:])


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(loaded, prompt, reference):
    core = engine(loaded, max_num_batched_tokens=512)
    run(core, "warm", prompt, max_tokens=1)  # its blocks now sit in the prefix cache
    assert run(core, "hit", prompt, max_tokens=1)[0].num_cached_tokens > 0
    (delta,) = run(core, "asks", prompt, max_tokens=1, prompt_logprobs=NUM_TOP)
    assert delta.num_cached_tokens == 0
    check_against_reference(delta, prompt, reference)


def test_requests_without_prompt_logprobs_carry_none(loaded, prompt):
    core = engine(loaded, max_num_batched_tokens=512)
    assert all(d.prompt_logprobs is None for d in run(core, "a", prompt, max_tokens=2))
