"""The per-token logprob checks on Responses streams
(sluice/audit/checks/responses_tokens.py, token_entries.py): a conforming
stream passes; alternatives of one token shown on another, a logprob unlike
the token's own listed one, or entries that do not spell the text are
flagged, with no lag needed."""

from __future__ import annotations

import copy

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.checks.responses_final import LOGPROBS_INCLUDE
from sluice.audit.records import RESPONSES
from tests.agent_script import encode_all, responses_answer
from tests.broken_servers import MODEL, recorded

BODY = {"model": MODEL, "input": "Tell a story.", "max_output_tokens": 24, "temperature": 0,
        "include": [LOGPROBS_INCLUDE], "top_logprobs": 2, "stream": True}  # fmt: skip


def ids_of(events: list[dict], body: dict = BODY) -> set[str]:
    stream = recorded(RESPONSES, body, encode_all(events))
    return {finding.check_id for finding in check_exchange(stream)}


def deltas(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "response.output_text.delta" and e["logprobs"]]


def events() -> list[dict]:
    return copy.deepcopy(responses_answer(BODY)[0])


def test_a_conforming_stream_passes():
    assert ids_of(events()) == set()


def test_the_first_tokens_alternatives_on_a_later_token_are_flagged_under_greedy():
    stream = events()
    first, second = deltas(stream)[:2]
    second["logprobs"][0]["top_logprobs"] = copy.deepcopy(first["logprobs"][0]["top_logprobs"])
    assert ids_of(stream) == {"logprob_greedy_head"}


def test_a_token_listed_at_another_logprob_than_its_own_is_flagged_when_sampling():
    stream = events()
    entry = deltas(stream)[1]["logprobs"][0]
    entry["top_logprobs"][0]["logprob"] = entry["logprob"] + 0.5
    assert ids_of(stream, {**BODY, "temperature": 0.8}) == {"logprob_own_entry"}
    assert ids_of(stream) == {"logprob_greedy_head"}  # greedy: the head check says it


def test_entries_that_do_not_spell_the_deltas_text_are_flagged():
    stream = events()
    entry = deltas(stream)[1]["logprobs"][0]
    entry["token"], entry["bytes"] = "zz", list(b"zz")
    entry["top_logprobs"][0].update(token="zz", bytes=list(b"zz"))
    assert "logprob_alignment" in ids_of(stream)
