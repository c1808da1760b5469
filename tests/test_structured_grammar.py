"""A spec's grammar as the HTTP edge checks it: a source over the size limit
and a compile over the CPU-time limit are 400s naming the field, before the
engine sees the request; a refused spec is remembered, not compiled again."""

from __future__ import annotations

import httpx2
import pytest

from sluice.structured import grammar as grammar_module
from sluice.structured.grammar import (
    MAX_GRAMMAR_SOURCE_CHARS,
    GrammarError,
    GrammarLimitError,
    grammar_of,
)
from sluice.structured.spec import StructuredOutputSpec
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served():
    """A live server on the fake engine; the params of every request it got."""
    seen = []

    def script(request_id, prompt, params):
        seen.append(params)
        return [ord(c) for c in '"a"']

    engine = LoopFakeEngine(script=script)
    with (
        LiveServer(engine, ChatFakeTokenizer()) as server,
        httpx2.Client(base_url=server.url, timeout=30) as http,
    ):
        yield http, seen


def test_a_schema_over_the_size_limit_is_a_400_naming_the_field(served):
    http, seen = served
    # '"value-0000000",' is 16 characters: the schema is just over the limit.
    enum = [f"value-{i:07d}" for i in range(MAX_GRAMMAR_SOURCE_CHARS // 16 + 1)]
    assert len(StructuredOutputSpec.json_schema({"enum": enum}).value) > MAX_GRAMMAR_SOURCE_CHARS
    body = {"model": MODEL, "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "A", "schema": {"enum": enum}}}}  # fmt: skip
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert f"over the limit of {MAX_GRAMMAR_SOURCE_CHARS}" in error["message"]
    assert seen == []  # the engine never saw it
    # Just under the limit, the same form is served.
    body["response_format"]["json_schema"]["schema"] = {"enum": enum[: len(enum) // 2]}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_a_spec_over_the_compile_time_limit_is_a_400_naming_the_field(served, monkeypatch):
    http, seen = served
    # Every compile takes some CPU: none is within a limit of zero.
    monkeypatch.setattr(grammar_module, "MAX_GRAMMAR_COMPILE_CPU_S", 0.0)
    before = len(seen)
    body = {"model": MODEL, "prompt": "hi", "structured_outputs": {"regex": "[0-9]{3}-timed"}}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "structured_outputs.regex"
    assert "s of CPU, over the limit of 0.0 s" in error["message"]
    assert len(seen) == before


def test_a_refused_spec_is_remembered_and_not_compiled_again(monkeypatch):
    compiled = []
    grammar_text = grammar_module.grammar_text

    def counting(spec):
        compiled.append(spec)
        return grammar_text(spec)

    monkeypatch.setattr(grammar_module, "grammar_text", counting)
    spec = StructuredOutputSpec.regex("[unclosed-remembered")
    for _ in range(2):
        with pytest.raises(GrammarError) as refused:
            grammar_of(spec)
        assert not isinstance(refused.value, GrammarLimitError)
    assert compiled == [spec]


def test_checked_grammars_stay_within_their_characters_and_drop_the_least_recent():
    from sluice.structured.grammar import CheckedGrammars, grammar_of

    cache = CheckedGrammars(max_entries=100, max_chars=3_000)
    specs = [StructuredOutputSpec.regex("a" * 400 + str(i)) for i in range(20)]
    for spec in specs[:3]:
        cache.put(spec, grammar_of(spec))
    assert cache.get(specs[0]) is not None  # now the most recent
    for spec in specs[3:]:
        cache.put(spec, grammar_of(spec))
        assert cache.chars <= 3_000
    assert cache.get(specs[0]) is None and cache.get(specs[-1]) is not None
    huge = StructuredOutputSpec.regex("b" * 5_000)
    cache.put(huge, grammar_of(huge))
    assert cache.get(huge) is None, "one entry over the bound is not kept"


def test_the_servers_grammar_checks_keep_big_schemas_within_the_character_bound(monkeypatch):
    from sluice.structured.grammar import GRAMMAR_CACHE_CHARS, CheckedGrammars, grammar_of

    # The server's cache, shrunk to 1 M characters: 20,000-value enums (about
    # 0.5 M characters of spec and grammar each) must evict one another.
    cache = CheckedGrammars(max_entries=256, max_chars=1_000_000)
    monkeypatch.setattr(grammar_module, "CHECKED_GRAMMARS", cache)
    values = [f"value-{i:06d}" for i in range(20_000)]
    specs = [
        StructuredOutputSpec.json_schema({"enum": [f"{n}-{v}" for v in values]}) for n in range(4)
    ]
    for spec in specs:
        grammar_of(spec)
        assert cache.chars <= 1_000_000
    assert cache.get(specs[0]) is None and cache.get(specs[-1]) is not None
    assert GRAMMAR_CACHE_CHARS <= 64 << 20, "the default pins at most tens of MB"
