"""The audit's Ollama dialect (sluice/audit/checks/ollama.py, scenarios/ollama.py):
recorded answers, each broken form flagged and the conforming one not; the
scenario against sluice on a fake engine (merged lines, twins) passes, and a
server without /api/chat is one note with nothing sent."""

from __future__ import annotations

import asyncio
import json

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.options import QUICK, AuditOptions, with_overrides
from sluice.audit.records import OLLAMA_CHAT, AuditResult, Target
from sluice.audit.runner import run_audit
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME, LiveServer
from tests.broken_servers import MODEL, recorded, serving

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a story."}],
        "options": {"temperature": 0, "num_predict": 4}}  # fmt: skip
NDJSON = "application/x-ndjson"


def line(content: str = "", done: bool = False, **fields) -> dict:
    return {"model": MODEL, "message": {"role": "assistant", "content": content}, "done": done,
            **fields}  # fmt: skip


def final(eval_count: int = 4, done_reason: str = "length", content: str = "") -> dict:
    return line(content, True, done_reason=done_reason, prompt_eval_count=9, eval_count=eval_count)


GOOD_LINES = [line("Once "), line("upon a"), final()]
TWIN = final(content="Once upon a")


def encode(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in lines)


def stream_ids(lines: list[dict] | bytes, twin: dict = TWIN, **fields) -> set[str]:
    raw = lines if isinstance(lines, bytes) else encode(lines)
    twin_exchange = recorded(OLLAMA_CHAT, {**BODY, "stream": False}, json.dumps(twin).encode())
    fields.setdefault("content_type", NDJSON)
    exchange = recorded(OLLAMA_CHAT, {**BODY, "stream": True}, raw, twin=twin_exchange, **fields)
    return {finding.check_id for finding in check_exchange(exchange)}


def test_a_conforming_stream_and_its_twin_raise_nothing():
    assert stream_ids(GOOD_LINES) == set()


def test_lines_that_are_not_ndjson_are_framing_breaks():
    assert stream_ids(GOOD_LINES, content_type="text/event-stream") == {"ollama_framing"}
    assert "ollama_framing" in stream_ids(encode(GOOD_LINES) + b"not json\n")
    assert "ollama_framing" in stream_ids(encode(GOOD_LINES)[:-1])


def test_a_stream_must_end_with_its_one_done_line():
    assert "ollama_done" in stream_ids(GOOD_LINES[:-1])
    assert "ollama_done" in stream_ids([line("Once "), final(), line("upon a"), final()])
    assert "ollama_done" in stream_ids([*GOOD_LINES[:-1], {**final(), "done_reason": None}])


def test_an_empty_line_is_a_strict_finding():
    assert stream_ids([line("Once "), line(""), line("upon a"), final()]) == {"ollama_empty_line"}


def test_eval_count_must_agree_with_num_predict():
    assert "ollama_eval_count" in stream_ids([*GOOD_LINES[:-1], final(eval_count=3)],
                                             twin={**TWIN, "eval_count": 3})  # fmt: skip
    assert "ollama_eval_count" in stream_ids([*GOOD_LINES[:-1], final(6, "stop")],
                                             twin={**TWIN, "eval_count": 6})  # fmt: skip
    missing = {**final(), "eval_count": None}
    assert "ollama_eval_count" in stream_ids([*GOOD_LINES[:-1], missing])


def test_a_stream_unlike_its_twin_is_a_determinism_note():
    twin = final(content="Once upon a time")
    assert stream_ids(GOOD_LINES, twin=twin) == {"ollama_stream_mismatch"}


def test_an_error_must_be_ollamas_shape():
    openai_shaped = json.dumps({"error": {"message": "bad", "type": "invalid_request_error"}})
    exchange = recorded(OLLAMA_CHAT, BODY, openai_shaped.encode(), status=400)
    assert {f.check_id for f in check_exchange(exchange)} == {"ollama_error_shape"}
    exchange = recorded(OLLAMA_CHAT, BODY, b'{"error": "bad"}', status=400)
    assert check_exchange(exchange) == []


def audit(url: str, model: str) -> AuditResult:
    sizes = with_overrides(QUICK, {"ollama": {"slow_read_bytes": 64,
                                              "slow_read_interval_s": 0.002}})  # fmt: skip
    options = AuditOptions(scenarios=("ollama",), sizes=sizes, vllm_extensions="off")
    return asyncio.run(run_audit([Target("server", url, model)], options))


def test_sluice_passes_the_ollama_scenario_with_merged_lines():
    engine = LoopFakeEngine(tokens_per_step=(1, 4), seed=3)
    with LiveServer(engine, ChatFakeTokenizer(), send_buffer_bytes=4096) as live:
        result = audit(live.url, DEFAULT_MODEL_NAME)
    assert [f for f in result.findings if f.is_failure] == []
    (ollama,) = result.results
    cases = {exchange.case for exchange in ollama.exchanges}
    assert {"ollama/plain slow reader", "ollama/plain normal reader",
            "ollama/truncated slow reader", "ollama/messages not a list"} <= cases  # fmt: skip
    assert all(e.twin is not None for e in ollama.exchanges if e.is_stream)
    assert ollama.figures["slow_streams"] == 2 and ollama.figures["slow_output_tokens"] > 0


def test_a_server_without_api_chat_is_one_note_and_nothing_sent():
    with serving() as url:
        result = audit(url, MODEL)
    assert [(f.check_id, f.severity) for f in result.findings] == [("api_not_served", "note")]
    assert result.results[0].exchanges == []
