"""The thinking budget over HTTP, on real sockets: a tiny model whose chat
template opens `<think>` in the prompt (DeepSeek-R1's way), served with
n-gram speculation. Chat's `thinking_token_budget`, Responses'
`reasoning.effort` (through --reasoning-effort-budgets) and Messages'
`thinking.budget_tokens` each cut the reasoning at exactly the budget: the
reasoning is the text of the first N tokens the model writes for that prompt
(a completion of N tokens says which), the forced `</think>` ends it as any
end of reasoning does, and the answer follows; streamed and not, the same.
A `chat_template_kwargs` variable reaches the template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx2
import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from sluice.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ReasoningEffortBudgets,
    SpeculativeConfig,
)
from sluice.testing.live_server import LiveServer

if TYPE_CHECKING:
    from sluice.engine.core import EngineCore

BUDGET = 6
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if shout %}LOUD\n{% endif %}"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
)
USER = [{"role": "user", "content": "count the cats: cat cat cat cat cat"}]
NGRAM = SpeculativeConfig(num_speculative_tokens=6, prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.fixture(scope="module")
def thinking_folder(tiny_folder: Path, tmp_path_factory) -> Path:
    """The tiny folder with `<think>` and `</think>` as one token each (two of
    its unused `extra` ids, so the model can write them) and TEMPLATE."""
    folder = tmp_path_factory.mktemp("thinking") / "tiny-thinking"
    folder.mkdir()
    for item in tiny_folder.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    backend = BackendTokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = backend.get_vocab()
    data = json.loads(backend.to_str())
    # Rename two unused ids, so the markers stay inside the model's vocabulary.
    model_vocab = data["model"]["vocab"]
    for marker, extra in (("<think>", "extra0"), ("</think>", "extra1")):
        model_vocab[marker] = model_vocab.pop(extra)
    backend = BackendTokenizer.from_str(json.dumps(data))
    backend.add_tokens(
        [AddedToken("<think>", special=False), AddedToken("</think>", special=False)]
    )
    assert backend.token_to_id("</think>") == vocab["extra1"]
    backend.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def served(thinking_folder: Path) -> Iterator[tuple[httpx2.Client, EngineCore]]:
    from sluice.engine.core import EngineCore
    from sluice.engine.inproc_client import InProcessEngineClient

    config = EngineConfig(
        model=ModelConfig(model=str(thinking_folder), dtype="float32", quantization=None,
                          activation_quantization=None, max_model_len=256,
                          batch_invariant=True),
        cache=CacheConfig(kv_cache_memory_bytes=8 << 20),
        multiprocess=False,
        speculative_config=NGRAM,
    )  # fmt: skip
    core = EngineCore(config)
    with (
        LiveServer(
            InProcessEngineClient(core), core.loaded.tokenizer, model_name=core.loaded.name,
            max_model_len=256, engine=config, startup_timeout_s=120,
            reasoning_effort_budgets=ReasoningEffortBudgets(low=BUDGET),
        ) as live,
        httpx2.Client(base_url=live.url, timeout=120) as http,
    ):  # fmt: skip
        yield http, core


@pytest.fixture
def server(served) -> httpx2.Client:
    return served[0]


def free_reasoning(http: httpx2.Client) -> str:
    """The text of the first BUDGET tokens the model writes for USER's prompt."""
    tokens = http.post("/tokenize", json={"messages": USER}).json()["tokens"]
    body = {"prompt": tokens, "max_tokens": BUDGET, "temperature": 0, "ignore_eos": True}
    completion = http.post("/v1/completions", json=body).json()
    assert completion["usage"]["completion_tokens"] == BUDGET
    text = completion["choices"][0]["text"]
    assert "</think>" not in text, "the model ends its reasoning by itself: pick another prompt"
    return text


def streamed_chat(http: httpx2.Client, body: dict) -> tuple[str, str]:
    reasoning, content = "", ""
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                reasoning += choice["delta"].get("reasoning_content") or ""
                content += choice["delta"].get("content") or ""
    return reasoning, content


def test_chat_reasoning_is_cut_at_the_token_budget(server):
    expected = free_reasoning(server)
    body = {"messages": USER, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "thinking_token_budget": BUDGET}  # fmt: skip
    message = server.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["reasoning_content"] == expected
    assert message["content"]  # the answer after the forced end
    assert streamed_chat(server, body) == (expected, message["content"])


def test_chat_without_a_budget_reasons_past_it(server):
    expected = free_reasoning(server)
    body = {"messages": USER, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    message = server.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["reasoning_content"].startswith(expected)
    assert len(message["reasoning_content"]) > len(expected)


def test_responses_effort_budget_cuts_the_reasoning_item(server):
    expected = free_reasoning(server)
    body = {"input": USER, "max_output_tokens": 24, "temperature": 0,
            "reasoning": {"effort": "low"}}  # fmt: skip
    output = server.post("/v1/responses", json=body).json()["output"]
    reasoning = [item for item in output if item["type"] == "reasoning"]
    texts = [part["text"] for item in reasoning for part in item["content"]]
    assert texts == [expected]


def test_messages_budget_tokens_cut_the_thinking_block(server):
    expected = free_reasoning(server)
    body = {"messages": USER, "max_tokens": 24, "temperature": 0,
            "thinking": {"type": "enabled", "budget_tokens": BUDGET}}  # fmt: skip
    content = server.post("/v1/messages", json=body).json()["content"]
    assert [block["thinking"] for block in content if block["type"] == "thinking"] == [expected]


def test_a_template_variable_reaches_the_template(server):
    plain = server.post("/tokenize", json={"messages": USER}).json()["count"]
    body = {"messages": USER, "max_tokens": 1, "chat_template_kwargs": {"shout": True}}
    usage = server.post("/v1/chat/completions", json=body).json()["usage"]
    assert usage["prompt_tokens"] == plain + len("LOUD\n")
    tokenized = server.post("/tokenize", json={**body, "max_tokens": None}).json()
    assert tokenized["count"] == usage["prompt_tokens"]


def test_the_budget_holds_while_drafts_are_accepted(served):
    http, core = served
    counters = core.speculator.counters
    accepted = counters.num_accepted_tokens
    test_chat_reasoning_is_cut_at_the_token_budget(http)
    assert counters.num_accepted_tokens > accepted
