"""The audit's `tools` scenario: how it accumulates calls from deltas, the
scenario against sluice on a scripted fake engine (correct calls pass; a
stream unlike its twin, bad arguments and an answer without calls are each
flagged), and against sluice on the embedded model (slow)."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from sluice.audit.options import QUICK, AuditOptions, with_overrides
from sluice.audit.records import AuditResult, Target
from sluice.audit.runner import run_audit
from sluice.audit.scenarios.tools import Call, accumulate_calls
from sluice.audit.stream_view import ChoiceChunk
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME, LiveServer, in_process_server

SIZES = with_overrides(
    QUICK, {"tools": {"requests": 2, "slow_read_bytes": 16, "slow_read_interval_s": 0.001}}
)
TOKENIZER = ChatFakeTokenizer()
WEATHER = '{"city": "Zürich 😀", "unit": "celsius"}'
REQUIRED = f'[{{"name": "get_weather", "parameters": {WEATHER}}}, {{"name": "get_time", "parameters": {{"timezone": "Asia/Tokyo"}}}}]'
REQUIRED_OTHER = f'[{{"name": "get_weather", "parameters": {WEATHER}}}]'


def audit(url: str, model: str) -> AuditResult:
    options = AuditOptions(scenarios=("tools",), sizes=SIZES)
    return asyncio.run(run_audit([Target("server", url, model)], options))


def audit_fake(required_answers, named_answer: str = WEATHER) -> AuditResult:
    """The scenario against sluice on a fake engine: a forced array of calls
    answers `required_answers` in turn, a named function `named_answer`."""
    answers = itertools.cycle(required_answers)

    def script(request_id, prompt, params):
        if params.structured_output is None:  # the audit's preflight probes
            return TOKENIZER.encode("Fine, thanks.")
        schema = json.loads(params.structured_output.value)
        text = next(answers) if schema.get("type") == "array" else named_answer
        return TOKENIZER.encode(text)

    with LiveServer(LoopFakeEngine(script=script, tokens_per_step=(1, 5)), TOKENIZER) as live:
        return audit(live.url, DEFAULT_MODEL_NAME)


def invariants(result: AuditResult) -> set[str]:
    return {f.check_id for f in result.findings if f.is_failure}


def chunk(number: int, tool_calls: list) -> ChoiceChunk:
    return ChoiceChunk(number, "", None, True, None, None, None, 0.0, tool_calls=tool_calls)


def test_calls_are_accumulated_as_the_sdk_does_and_bad_deltas_named():
    first = {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": '{"a"'}}  # fmt: skip
    chunks = [chunk(1, [first]), chunk(2, [{"index": 0, "function": {"arguments": ": 1}"}}])]
    assert accumulate_calls(chunks, is_stream=True).calls == [Call("f", '{"a": 1}')]
    renamed = chunk(3, [{"index": 0, "function": {"name": "g", "arguments": ""}}])
    skipped = chunk(4, [{"index": 2, "id": "x", "type": "function", "function": {"name": "h"}}])
    found = accumulate_calls([*chunks, renamed, skipped], is_stream=True)
    assert [number for number, _ in found.problems] == [3, 4]


def test_correct_calls_pass_with_every_call_checked():
    result = audit_fake([REQUIRED])
    assert result.findings == []
    # required: 2 calls in each of warm-up, stream and twin; named: 1 in each.
    assert result.results[0].figures == {"calls_checked": 9.0, "streams_equal": 2.0}
    slow = [e for e in result.results[0].exchanges if e.reader == "slow"]
    assert len(slow) == 2 and all(e.is_stream for e in slow)


@pytest.mark.parametrize(
    ("required", "named", "check_id"),
    [
        # The warm-up and the twin get one answer, the stream the other.
        ([REQUIRED, REQUIRED_OTHER, REQUIRED], WEATHER, "tools_stream_mismatch"),
        ([REQUIRED], '{"city": "Oslo", }', "tools_invalid_arguments"),
        (['[{"name": "get_weather", "parameters": ["x"]}]'], WEATHER, "tools_invalid_arguments"),
        (["I would rather not."], WEATHER, "tools_no_call"),
    ],
)
def test_broken_calls_are_flagged_with_their_check(required, named, check_id):
    result = audit_fake(required, named)
    assert invariants(result) == {check_id}
    found = next(f for f in result.findings if f.check_id == check_id)
    assert found.message and found.request


@pytest.mark.slow
def test_the_tools_scenario_passes_against_sluice_on_the_embedded_model(embedded_model_config):
    with in_process_server(embedded_model_config) as live:
        result = audit(live.url, live.model_name)
    assert not result.has_broken_invariant, [f.message for f in result.findings]
    figures = result.results[0].figures
    assert figures["streams_equal"] == 2.0 and figures["calls_checked"] >= 6.0
