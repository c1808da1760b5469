"""Findings grouped by cause across responses: streams in llama-server's
shapes (tests/peer_shapes.py) give its real causes once each, with the
requests they affect, and nothing the server did right."""

from __future__ import annotations

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import (
    CHAT,
    COMPLETIONS,
    RESPONSES,
    AuditResult,
    Exchange,
    ScenarioResult,
    Target,
)
from sluice.audit.summary import failing_headline, group_causes, summarize_audit
from tests.broken_servers import chat_chunk, recorded, sse
from tests.peer_shapes import (
    LLAMA_CREATED,
    LLAMA_ERROR_400,
    llama_completion_chunk,
    llama_logprob_entry,
    llama_stream,
    llama_usage,
)

LOGPROBS_BODY = {
    "model": "m", "prompt": "p", "stream": True, "logprobs": 1, "max_tokens": 4,
    "temperature": 0, "stream_options": {"include_usage": True},
}  # fmt: skip


def llama_logprobs_stream(prompt: str) -> Exchange:
    """4 tokens, the last two one character (merged into one entry); created
    ticks over a second; usage on the finish chunk."""
    entries = [llama_logprob_entry(t, -0.3, [(t, -0.3)]) for t in ("A", " fox", " 東")]
    raw = llama_stream(
        llama_completion_chunk("A", logprobs=entries[:1]),
        llama_completion_chunk(" fox", logprobs=entries[1:2], created=LLAMA_CREATED + 1),
        llama_completion_chunk(
            " 東", "length", logprobs=entries[2:], usage=llama_usage(2, 4),
            created=LLAMA_CREATED + 1,
        ),
    )  # fmt: skip
    return recorded(COMPLETIONS, {**LOGPROBS_BODY, "prompt": prompt}, raw)


def llama_exchanges() -> list[Exchange]:
    multi_prompt = recorded(
        COMPLETIONS,
        {"model": "m", "prompt": ["a", "b"], "stream": True},
        llama_stream(
            None,
            llama_completion_chunk("x", "length", index=0),
            llama_completion_chunk("y", "length", index=1),
        ),
    )
    lost_role = recorded(
        CHAT,
        {"model": "m", "messages": [], "stream": True},
        sse(chat_chunk(0, {"content": "🦊"}), chat_chunk(0, {"content": "!"}, "stop")),
    )
    bad_input = recorded(CHAT, {"model": "m"}, LLAMA_ERROR_400, status=400, expects_error=True)
    streams = [llama_logprobs_stream(prompt) for prompt in ("one", "two", "three")]
    return [*streams, multi_prompt, lost_role, bad_input]


def test_llama_server_shapes_group_into_their_causes_with_the_requests_each_affects():
    findings = [item for exchange in llama_exchanges() for item in check_exchange(exchange)]
    causes = group_causes(findings, ["server"])
    assert [(c.severity, c.check_id, c.num_requests) for c in causes] == [
        ("break", "id_changed", 3),
        ("break", "logprob_count", 3),
        ("break", "logprob_shape", 3),
        ("break", "usage_placement", 3),
        ("break", "data_null", 1),
        ("break", "role_not_first", 1),
        ("strict", "error_param_missing", 1),
    ]
    assert causes[0].cause == "created differs between chunks of one response"
    assert causes[1].messages == [
        "3 logprob entries for 4 tokens (finished by length at max_tokens)"
    ]
    assert causes[3].cause == "usage on the finish chunk instead of a usage chunk with choices: []"
    assert failing_headline(causes, findings) == "7 causes in 7 checks (6 requests)"


def test_one_cause_keeps_every_distinct_message_once():
    exchanges = [llama_logprobs_stream("one"), llama_logprobs_stream("two")]
    findings = [item for exchange in exchanges for item in check_exchange(exchange)]
    created = next(c for c in group_causes(findings, ["server"]) if c.check_id == "id_changed")
    assert created.requests == {"server": 2}
    assert len(created.messages) == 1 and created.example is not None


def test_agent_api_streams_are_left_out_of_the_determinism_figure():
    body = {"model": "m", "input": "p", "stream": True}
    twin = recorded(RESPONSES, {**body, "stream": False}, b"{}")
    stream = recorded(RESPONSES, body, b"", twin=twin)
    chat_twin = recorded(CHAT, {"model": "m", "messages": []}, b"{}")
    chat = recorded(CHAT, {"model": "m", "messages": [], "stream": True},
                    sse(chat_chunk(0, {"content": "hi"}, "stop")), twin=chat_twin)  # fmt: skip
    result = ScenarioResult("responses", "server", 0.0, 1.0, [stream, chat])
    audit = AuditResult([Target("server", "u", "m")], "quick", ["responses"], [result], "t", 1.0)
    assert summarize_audit(audit).determinism["server"].compared == 1
