"""The audit's `structured` scenario: its validator, the scenario against
sluice on a scripted fake engine (a correct answer passes; invalid JSON, a
schema violation and a stream unlike its twin are each flagged), and the
scenario against sluice on the embedded model (slow)."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from sluice.audit.json_schema_subset import schema_errors
from sluice.audit.options import QUICK, AuditOptions, with_overrides
from sluice.audit.records import AuditResult, Target
from sluice.audit.runner import run_audit
from sluice.audit.scenarios.structured import SCHEMA
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME, LiveServer, in_process_server

SIZES = with_overrides(
    QUICK, {"structured": {"requests": 2, "slow_read_bytes": 16, "slow_read_interval_s": 0.001}}
)
VALID = {"name": "Ann", "age": 30, "is_student": False, "languages": ["en"], "mood": "calm"}
TOKENIZER = ChatFakeTokenizer()


def audit(url: str, model: str) -> AuditResult:
    options = AuditOptions(scenarios=("structured",), sizes=SIZES)
    return asyncio.run(run_audit([Target("server", url, model)], options))


def audit_fake(texts) -> AuditResult:
    """The scenario against sluice on a fake engine that answers `texts` in turn."""
    answers = itertools.cycle(texts)

    def script(request_id, prompt, params):
        if params.structured_output is None:  # the audit's preflight probes
            return TOKENIZER.encode("Fine, thanks.")
        return TOKENIZER.encode(next(answers))

    with LiveServer(LoopFakeEngine(script=script, tokens_per_step=3), TOKENIZER) as live:
        return audit(live.url, DEFAULT_MODEL_NAME)


def invariants(result: AuditResult) -> set[str]:
    return {f.check_id for f in result.findings if f.is_failure}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (VALID, None),
        ({**VALID, "age": "30"}, "$.age: expected integer"),
        ({**VALID, "age": True}, "$.age: expected integer"),
        ({**VALID, "mood": "sad"}, "$.mood: 'sad' is not one of"),
        ({**VALID, "languages": []}, "$.languages: length 0 below minItems"),
        ({**VALID, "languages": ["a", "b", "c", "d"]}, "$.languages: length 4 above maxItems"),
        ({**VALID, "languages": [1]}, "$.languages[0]: expected string"),
        ({**VALID, "name": "x" * 41}, "$.name: length 41 above maxLength"),
        ({**VALID, "extra": 1}, "$: unexpected 'extra'"),
        ({k: v for k, v in VALID.items() if k != "mood"}, "$: missing 'mood'"),
        ([VALID], "$: expected object"),
    ],
)
def test_the_validator_reads_the_keywords_the_schema_uses(value, error):
    errors = schema_errors(value, SCHEMA)
    assert errors == [] if error is None else errors[0].startswith(error)


def test_the_validator_refuses_a_keyword_it_does_not_know():
    with pytest.raises(AssertionError, match="pattern"):
        schema_errors("x", {"type": "string", "pattern": "x+"})


def test_a_correct_answer_passes_with_every_output_checked():
    result = audit_fake([json.dumps(VALID)])
    assert result.findings == []
    # Per prompt: warm-up, slow stream and its twin.
    assert result.results[0].figures == {
        "outputs_checked": 6.0,
        "outputs_valid": 6.0,
        "streams_equal": 2.0,
    }
    slow = [e for e in result.results[0].exchanges if e.reader == "slow"]
    assert len(slow) == 2 and all(e.is_stream for e in slow)


@pytest.mark.parametrize(
    ("texts", "check_id"),
    [
        (['{"name": "Ann", "age": 3'], "structured_invalid_json"),
        ([json.dumps({**VALID, "mood": "sad"})], "structured_schema_mismatch"),
        # The warm-up and the twin get one answer, the stream the other.
        ([json.dumps(VALID), json.dumps({**VALID, "age": 31}), json.dumps(VALID)],
         "structured_stream_mismatch"),
    ],
)  # fmt: skip
def test_a_broken_answer_is_flagged_with_its_check(texts, check_id):
    result = audit_fake(texts)
    assert invariants(result) == {check_id}
    found = next(f for f in result.findings if f.check_id == check_id)
    assert found.message and found.request


@pytest.mark.slow
def test_the_structured_scenario_passes_against_sluice_on_the_embedded_model(
    embedded_model_config,
):
    with in_process_server(embedded_model_config) as live:
        result = audit(live.url, live.model_name)
    assert not result.has_broken_invariant, [f.message for f in result.findings]
    figures = result.results[0].figures
    assert figures["outputs_valid"] == figures["outputs_checked"] == 6.0
    assert figures["streams_equal"] == 2.0
