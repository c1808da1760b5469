"""benchmarks/_agent_replay_run.py against a fake upstream over a real socket: each recorded
request goes in its own dialect where the server takes it and as chat where not, in order,
and each measured request gets a probe of exactly its new tokens."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from tests.agent_replay_fakes import fake_upstream

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
run = importlib.import_module("_agent_replay_run")
session_file = importlib.import_module("_agent_session")

RESPONSES = {"model": "m", "input": "fix it", "instructions": "be Codex", "stream": True}
MESSAGES = {"model": "c", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}],
            "stop_sequences": ["."]}  # fmt: skip


def _turns():
    first = session_file.Recorded(1, "POST", "/v1/responses", "", {}, RESPONSES, 200)
    second = session_file.Recorded(2, "POST", "/v1/messages", "beta=true",
                                   {"anthropic-version": "2023-06-01"}, MESSAGES, 200)  # fmt: skip
    return {1: [first], 2: [second]}


def _spec(dialects):
    return run.ServerSpec("fake", "unused", frozenset(dialects))


def test_requests_go_in_their_own_dialect_to_a_server_that_takes_it():
    with fake_upstream() as (url, upstream):
        measured = run.replay_phase(url, _spec({"responses", "messages"}), "cold", _turns(),
                                    "served", 8, True)  # fmt: skip
    assert [(p, q) for p, q, _, _ in upstream.received] == [
        ("/v1/responses", ""), ("/v1/messages", "beta=true")]  # fmt: skip
    assert upstream.received[0][3]["max_output_tokens"] == 8
    assert upstream.received[1][3]["max_tokens"] == 8
    assert upstream.received[1][2]["anthropic-version"] == "2023-06-01"
    assert [(m.phase, m.turn, m.index, m.dialect) for m in measured] == [
        ("cold", 1, 1, "responses"), ("cold", 2, 1, "messages")]  # fmt: skip
    for item in measured:
        assert item.facts.first_content_s is not None and item.facts.error is None
        assert item.facts.num_cached_tokens == item.facts.num_prompt_tokens - 5
        assert item.num_new_tokens == 5


def test_requests_go_as_chat_to_a_server_that_speaks_only_chat():
    with fake_upstream() as (url, upstream):
        measured = run.replay_phase(url, _spec({"chat"}), "warm", _turns(), "served", 8, True)
    assert [p for p, _, _, _ in upstream.received] == ["/v1/chat/completions"] * 2
    first = upstream.received[0][3]
    assert first["messages"] == [{"role": "system", "content": "be Codex"},
                                 {"role": "user", "content": "fix it"}]  # fmt: skip
    assert first["model"] == "served"
    assert [m.dialect for m in measured] == ["chat", "chat"]
    assert all(m.facts.num_prompt_tokens for m in measured)


def test_each_probe_sends_exactly_the_new_tokens_as_fresh_random_ids():
    with fake_upstream() as (url, upstream):
        measured = run.replay_phase(url, _spec({"responses", "messages"}), "cold", _turns(),
                                    "served", 8, True)  # fmt: skip
        probes = run.prefill_probes(url, _spec(()), measured, "served", "run-1")
    sent = [body for path, _, _, body in upstream.received if path == "/v1/completions"]
    assert [len(body["prompt"]) for body in sent] == [5, 5]
    assert sent[0]["prompt"] != sent[1]["prompt"], "no probe shares a prefix with another"
    assert all(min(body["prompt"]) >= 1000 and body["max_tokens"] == 1 for body in sent)
    assert [(p.phase, p.turn) for p in probes] == [("prefill:cold", 1), ("prefill:cold", 2)]
    assert all(p.facts.first_content_s is not None for p in probes)
    # The same seed draws the same ids: a run is reproducible.
    assert run.probe_token_ids(5, "s") == run.probe_token_ids(5, "s")
