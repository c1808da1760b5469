"""The same answer under any load (issue 28), over HTTP against `sluice serve`
as users run it (default flags, the embedded model, its own process).

Four greedy chat probes with logprobs are sent alone, one at a time; then
again, streamed and not, while a crowd of 32 mixed requests runs: chat and
completions, streamed and not, greedy and seeded sampling, logprobs, and a
few long prompts (about 1,500 tokens) whose prefill shares the probes'
steps. Every probe must come back with the same text and the same logprobs,
to the last bit, as alone. The probes' prompts stay below the 512 positions
the default computes attention the same way under any chunking
(sluice/models/attention.py); the second run also hits the prefix cache
that the first filled.

Where the native int8 matmul does not run (no AVX512-VNNI, no compiler), the
default is not row-invariant and the test is skipped; the server's startup
line says which it is.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import aiohttp
import pytest

import sluice.engine.kv_cache
from sluice.models.native.int8 import int8_gemm_kernels
from tests.sluice_server import (  # noqa: F401 - the fixture
    RunningServer,
    running_server,
    sluice_server,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(int8_gemm_kernels() is None, reason="the default is not row-invariant here"),
]

PROBES = (
    "Explain why the sky is blue, in two sentences.",
    "List three uses of copper.",
    "Write a haiku about rain on a tin roof.",
    "What is 17 times 23? Show the steps.",
)
MAX_TOKENS = 24
CROWD_SIZE = 32


def probe_body(model: str, prompt: str, stream: bool) -> dict:
    return {
        "model": model, "messages": [{"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": True, "top_logprobs": 2,
        "stream": stream,
    }  # fmt: skip


def crowd_body(model: str, rng: random.Random, i: int) -> tuple[str, dict]:
    words = " ".join(rng.choice(["river", "stone", "lamp", "winter", "code", "salt"])
                     for _ in range(rng.choice([5, 40, 1200 if i % 10 == 0 else 60])))  # fmt: skip
    common = {"model": model, "max_tokens": rng.randrange(8, 40), "stream": i % 2 == 0}
    if rng.random() < 0.5:
        common |= {"temperature": 0.8, "seed": i}
    if i % 3 == 0:
        common |= {"logprobs": True, "top_logprobs": 1} if i % 4 else {}
    if i % 5 == 4:
        return "/v1/completions", {**common, "prompt": "Continue: " + words}
    return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": words}]}


async def read_answer(response: aiohttp.ClientResponse, stream: bool) -> tuple[str, list]:
    """(text, [(token, logprob, [(top token, top logprob)])]) of one chat choice."""
    assert response.status == 200, await response.text()
    if not stream:
        choice = (await response.json())["choices"][0]
        return choice["message"]["content"], entries(choice["logprobs"]["content"])
    text, logprobs = "", []
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:])["choices"]:
            text += choice["delta"].get("content") or ""
            if choice.get("logprobs"):
                logprobs += entries(choice["logprobs"]["content"])
    return text, logprobs


def entries(content: list) -> list:
    return [
        (e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]])
        for e in content
    ]


async def ask(session, base: str, path: str, body: dict) -> tuple[str, list] | None:
    async with session.post(base + path, json=body) as response:
        if path.endswith("chat/completions") and body.get("logprobs"):
            return await read_answer(response, body["stream"])
        assert response.status == 200, await response.text()
        await response.read()
        return None


async def alone_then_in_a_crowd(server: RunningServer):
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        alone = [
            await ask(session, server.base_url, "/v1/chat/completions",
                      probe_body(server.model, prompt, stream=False))
            for prompt in PROBES
        ]  # fmt: skip
        rng = random.Random(28)
        crowd = [crowd_body(server.model, rng, i) for i in range(CROWD_SIZE)]
        tasks = [asyncio.create_task(ask(session, server.base_url, path, body))
                 for path, body in crowd]  # fmt: skip
        probes = [
            asyncio.create_task(
                ask(session, server.base_url, "/v1/chat/completions",
                    probe_body(server.model, prompt, stream=stream))
            )
            for prompt in PROBES
            for stream in (False, True)
        ]  # fmt: skip
        crowded = await asyncio.gather(*probes)
        await asyncio.gather(*tasks)
    return alone, crowded


def test_greedy_probes_answer_bit_for_bit_alone_and_in_a_crowd(sluice_server):  # noqa: F811
    alone, crowded = asyncio.run(alone_then_in_a_crowd(sluice_server))
    for i, answer in enumerate(alone):
        text, logprobs = answer
        assert 0 < len(logprobs) <= MAX_TOKENS and text
        for stream, other in zip((False, True), crowded[2 * i : 2 * i + 2], strict=True):
            assert other == answer, f"probe {i} (stream={stream}) answered differently in a crowd"


async def greedy_copy(server: RunningServer, text: str) -> tuple[str, int]:
    """(text, completion tokens) of a greedy chat asked to copy `text`."""
    content = "Repeat the following Python code exactly. Output only the code.\n\n" + text
    body = {
        "model": server.model, "temperature": 0, "max_tokens": 400,
        "messages": [{"role": "user", "content": content}],
    }  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=600)
    url = server.base_url + "/v1/chat/completions"
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=body) as response,
    ):
        assert response.status == 200, await response.text()
        answer = await response.json()
    return answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]


def test_speculation_gives_the_greedy_text_it_gives_off_past_512_positions(
    sluice_server,  # noqa: F811 - the fixture
    embedded_model_config,
    tmp_path_factory,
):
    """The default speculates (n-gram drafts up to 16 tokens, verified in one
    step); copying ~900 tokens of code, past 512 positions where prefill
    attention is not a decode row, must answer exactly as a server with
    speculation off (a 17-token verification once went to flash attention
    there and changed the text)."""
    source = Path(sluice.engine.kv_cache.__file__).read_text(encoding="utf-8")[:3200]
    speculated = asyncio.run(greedy_copy(sluice_server, source))
    with running_server(
        embedded_model_config, tmp_path_factory, "--speculative-config", "none"
    ) as plain_server:
        plain = asyncio.run(greedy_copy(plain_server, source))
    assert speculated == plain and plain[1] > 200
