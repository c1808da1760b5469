"""The responses and messages scenarios (sluice/audit/scenarios/agent_cases.py,
responses.py, messages.py): against the scripted server of
tests/broken_servers.py the conforming one passes without a finding, each
agent-API breakage is caught, and a server without the routes is one note
per API; against sluice on a fake engine whose steps carry several tokens
(merged deltas, cut differently in a stream and in its twin) both pass."""

from __future__ import annotations

import asyncio
import json

import pytest

from sluice.audit.options import QUICK, AuditOptions, with_overrides
from sluice.audit.records import AuditResult, Target
from sluice.audit.runner import run_audit
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME, LiveServer
from tests.broken_servers import MODEL, Defect, serving

FAST_READER = {"slow_read_bytes": 256, "slow_read_interval_s": 0.001}
SIZES = with_overrides(QUICK, {"responses": FAST_READER, "messages": FAST_READER})
SCENARIOS = ("responses", "messages")


def audit(url: str, model: str) -> AuditResult:
    options = AuditOptions(scenarios=SCENARIOS, sizes=SIZES)
    return asyncio.run(run_audit([Target("server", url, model)], options))


def audit_script(defect: Defect = Defect.NONE, **server: object) -> AuditResult:
    with serving(defect, **server) as url:
        return audit(url, MODEL)


def failing(result: AuditResult) -> set[str]:
    return {finding.check_id for finding in result.findings if finding.is_failure}


def test_a_conforming_server_passes_both_groups_with_every_case_sent():
    result = audit_script()
    assert result.findings == []
    responses, messages = result.results
    cases = {e.case for e in responses.exchanges}
    assert {"responses/truncated slow reader", "responses/zero-argument tool slow reader",
            "responses/logprobs slow reader", "responses/plain normal reader"} <= cases  # fmt: skip
    assert all(e.twin is not None for e in responses.exchanges if e.is_stream)
    invalid = messages.exchanges[-1]
    assert invalid.case == "messages/max_tokens missing" and invalid.status == 400
    assert responses.figures["slow_streams"] == 6 and messages.figures["slow_streams"] == 5


# defect -> (the check that must catch it, checks allowed beside it)
CASES = {
    Defect.RESPONSES_COMPLETED_WHEN_TRUNCATED: ("responses_truncation",
                                                {"responses_stream_mismatch"}),
    Defect.RESPONSES_DELTA_LOST: ("responses_delta_mismatch", {"responses_logprobs"}),
    Defect.MESSAGES_TEXT_DELTA_ON_TOOL_USE: ("messages_delta_type", {"messages_stream_mismatch"}),
}  # fmt: skip


@pytest.mark.parametrize("defect", list(CASES), ids=lambda d: d.value)
def test_each_agent_api_breakage_is_caught_with_its_evidence(defect):
    expected, allowed = CASES[defect]
    result = audit_script(defect)
    assert expected in failing(result)
    assert failing(result) <= {expected, *allowed}
    example = next(f for f in result.findings if f.check_id == expected)
    assert example.evidence and example.evidence[0].startswith("#")
    assert example.request and " reader" in example.case


def test_a_server_without_the_agent_routes_is_one_note_per_api_and_nothing_sent():
    result = audit_script(serves_agent_apis=False)
    notes = [(f.check_id, f.severity) for f in result.findings]
    assert notes == [("api_not_served", "note"), ("api_not_served", "note")]
    assert all(r.exchanges == [] for r in result.results)
    assert not result.has_broken_invariant


TOKENIZER = ChatFakeTokenizer()
STORY = "Once upon a time a fox met a cat. They walked home together and talked. " * 3


def _script(request_id, prompt, params):
    """Text, unless a grammar forces a call: an array of calls, or one call's arguments."""
    if params.structured_output is None:
        return TOKENIZER.encode(STORY)
    schema = json.loads(params.structured_output.value)
    if schema.get("type") == "array":
        return TOKENIZER.encode('[{"name": "get_time", "parameters": {"timezone": "Asia/Tokyo"}}]')
    if not schema.get("properties"):
        return TOKENIZER.encode("{}")
    return TOKENIZER.encode('{"city": "Zürich 😀", "unit": "celsius"}')


def _greedy_logprobs(position: int, token_id: int, k: int):
    """As a greedy engine scores: the sampled token heads its k alternatives
    (the audit checks each Responses token's entry against its alternatives)."""
    logprob = -(1 + position) / 64
    others = tuple(i for i in range(k + 1) if i != token_id)[: max(k - 1, 0)]
    alternatives = (token_id, *others)[:k]
    return logprob, alternatives, tuple(logprob - j for j in range(len(alternatives)))


def test_sluice_on_a_fake_engine_with_merged_deltas_passes_both_groups():
    engine = LoopFakeEngine(script=_script, tokens_per_step=(1, 5), logprobs_fn=_greedy_logprobs)
    with LiveServer(engine, TOKENIZER) as live:
        result = audit(live.url, DEFAULT_MODEL_NAME)
    assert result.findings == [], [f.message for f in result.findings]
    figures = [r.figures for r in result.results]
    # Steps of up to five tokens: fewer delta events than output tokens.
    assert all(f["slow_delta_events"] < f["slow_output_tokens"] for f in figures)
