"""Served, on the embedded model with the default numerics: a server restarted
on the same --kv-cache-dir answers its first request from the disk tier
(cached_tokens > 0, the disk hits counted in /metrics) with the same tokens
and logprobs as the first server's cold answer."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.sluice_server import running_server

# A prompt of a few hundred tokens (below position 512, where the default's
# KV ignores chunking: tests/test_models_prefix_bits.py).
PROMPT = " ".join(f"Item {i}: the {i % 7}th colour of a list kept for testing." for i in range(30))


def complete(base_url: str, model: str) -> dict:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 2}
    request = urllib.request.Request(
        base_url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def disk_hits(base_url: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("sluice:kv_disk_hits_total")
    )


def answer(body: dict) -> tuple:
    choice = body["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]


def cached_tokens(body: dict) -> int:
    return (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


@pytest.mark.slow
def test_a_restarted_server_answers_from_the_disk_tier_with_the_same_bits(
    embedded_model_config, tmp_path_factory
):
    folder = tmp_path_factory.mktemp("kv-cache-dir")
    flags = ("--kv-cache-dir", str(folder))
    with running_server(embedded_model_config, tmp_path_factory, *flags) as server:
        cold = complete(server.base_url, server.model)
        assert cached_tokens(cold) == 0
    assert list(folder.rglob("*.kvb")), "the first server wrote no block"
    with running_server(embedded_model_config, tmp_path_factory, *flags) as server:
        warm = complete(server.base_url, server.model)
        assert cached_tokens(warm) > 0 and disk_hits(server.base_url) > 0
    assert answer(warm) == answer(cold)
