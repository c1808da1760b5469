"""Evaluation tools over HTTP on the embedded model (float32, in-process engine):
completions `echo` with `logprobs` (and `max_tokens: 0`, lm-eval's
loglikelihood request) and vLLM's `prompt_logprobs` on completions and chat,
against transformers' log-likelihoods of the same tokens."""

from __future__ import annotations

import httpx2
import pytest
import torch
from transformers import AutoModelForCausalLM

from sluice.testing.live_server import in_process_server

pytestmark = pytest.mark.slow

LOGPROB_ATOL = 1e-3  # float32 both sides, different orders (test_engine_prompt_logprobs.py)
CONTEXT = "Question: What is the capital of France?\nAnswer:"
CONTINUATION = " Paris"


@pytest.fixture(scope="module")
def live(embedded_model_config):
    with in_process_server(embedded_model_config) as server:
        yield server


@pytest.fixture(scope="module")
def http(live):
    with httpx2.Client(base_url=live.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def transformers_model(embedded_model_dir):
    return AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()


def reference_logprobs(model, token_ids: list[int]) -> list[float]:
    """transformers' log p(token i | tokens before it), i = 1 .. n-1."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()  # [n, vocab]
    logprobs = logits[:-1].log_softmax(dim=-1)
    return logprobs.gather(1, torch.tensor(token_ids[1:])[:, None])[:, 0].tolist()


def tokens_of(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"prompt": text}).json()["tokens"]


def test_echo_with_max_tokens_0_returns_the_prompt_and_its_logprobs(http, transformers_model):
    """lm-eval's loglikelihood request: the continuation's logprob is the sum
    over its tokens of the echoed prompt's token_logprobs."""
    body = {"prompt": CONTEXT + CONTINUATION, "echo": True, "max_tokens": 0, "logprobs": 1,
            "temperature": 0}  # fmt: skip
    response = http.post("/v1/completions", json=body).json()
    (choice,) = response["choices"]
    assert choice["text"] == CONTEXT + CONTINUATION
    logprobs = choice["logprobs"]
    token_ids = tokens_of(http, CONTEXT + CONTINUATION)
    assert len(logprobs["tokens"]) == len(token_ids)
    assert "".join(logprobs["tokens"]) == CONTEXT + CONTINUATION
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = reference_logprobs(transformers_model, token_ids)
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=LOGPROB_ATOL)
    for token, top in zip(logprobs["tokens"][1:], logprobs["top_logprobs"][1:], strict=True):
        assert token in top and len(top) <= 2
    assert response["usage"]["completion_tokens"] == 0


def test_echo_with_generation_puts_the_prompts_entries_before_the_completions(http):
    body = {"prompt": CONTEXT, "echo": True, "max_tokens": 3, "logprobs": 0, "temperature": 0}
    response = http.post("/v1/completions", json=body).json()
    (choice,) = response["choices"]
    num_prompt_tokens = len(tokens_of(http, CONTEXT))
    logprobs = choice["logprobs"]
    num_generated = response["usage"]["completion_tokens"]
    assert num_generated > 0
    assert len(logprobs["tokens"]) == num_prompt_tokens + num_generated
    assert choice["text"].startswith(CONTEXT)
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and offsets[num_prompt_tokens] == len(CONTEXT)
    assert choice["prompt_logprobs"][0] is None  # vLLM's field comes along, as in vLLM


def test_prompt_logprobs_on_completions_and_chat_in_vllms_shape(http, transformers_model):
    completion = http.post(
        "/v1/completions", json={"prompt": CONTEXT, "max_tokens": 1, "prompt_logprobs": 2}
    ).json()
    entries = completion["choices"][0]["prompt_logprobs"]
    token_ids = tokens_of(http, CONTEXT)
    assert entries[0] is None and len(entries) == len(token_ids)
    expected = reference_logprobs(transformers_model, token_ids)
    for token_id, entry, logprob in zip(token_ids[1:], entries[1:], expected, strict=True):
        assert entry[str(token_id)]["logprob"] == pytest.approx(logprob, abs=LOGPROB_ATOL)
        ranks = sorted(item["rank"] for item in entry.values())
        assert ranks[:2] == [1, 2] or entry[str(token_id)]["rank"] > 2
    messages = [{"role": "user", "content": "Hello"}]
    chat = http.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 1, "prompt_logprobs": 0}
    ).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 3


def test_prompt_logprobs_with_stream_is_a_400(http):
    body = {"prompt": CONTEXT, "max_tokens": 1, "prompt_logprobs": 1, "stream": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt_logprobs"
