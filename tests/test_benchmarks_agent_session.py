"""benchmarks/_agent_session.py: the recording file and the turns it replays."""

from __future__ import annotations

import gzip
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
session_file = importlib.import_module("_agent_session")


def _session():
    return session_file.Session(
        agent="codex", agent_version="0.171.0", dialect="responses",
        model="SmolLM2-135M-Instruct", server_command="sluice serve",
        prompts=["one", "two"], recorded_at="2026-12-07T15:00:00Z",
    )  # fmt: skip


def _request(turn, path="/v1/responses", method="POST", body=..., query=""):
    body = {"input": f"turn {turn}"} if body is ... else body
    return session_file.Recorded(turn=turn, method=method, path=path, query=query,
                                 headers={}, body=body, status=200)  # fmt: skip


def test_a_recording_reads_back_its_header_and_requests_in_order(tmp_path):
    requests = [
        _request(1),
        _request(1, "/v1/models", "GET", body=None),
        _request(2, query="beta=true"),
    ]
    path = tmp_path / "s.jsonl.gz"
    session_file.write_recording(path, _session(), requests)
    session, read = session_file.read_recording(path)
    assert session == _session()
    assert read == requests
    # Gzipped JSON lines: one header line, one line per request.
    with gzip.open(path, "rt") as lines:
        assert len(lines.read().splitlines()) == 4


def test_a_file_without_a_session_header_is_refused(tmp_path):
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.write('{"request": {}}\n')
    with pytest.raises(ValueError, match="session header"):
        session_file.read_recording(path)


def test_turns_group_the_generation_requests_in_the_order_they_were_sent():
    requests = [
        _request(2, body={"input": "b1"}),
        _request(1, "/v1/models", "GET", body=None),
        _request(1, body={"input": "a1"}),
        _request(1, "/v1/messages/count_tokens", body={"messages": []}),
        _request(1, "/v1/messages", body={"messages": ["a2"]}),
        _request(2, body={"input": "b2"}),
    ]
    turns = session_file.generation_turns(requests)
    assert list(turns) == [1, 2]
    assert [r.body for r in turns[1]] == [{"input": "a1"}, {"messages": ["a2"]}]
    assert [r.body for r in turns[2]] == [{"input": "b1"}, {"input": "b2"}]
    assert [r.dialect for r in turns[1]] == ["responses", "messages"]


def test_a_request_without_a_json_object_body_is_not_a_generation():
    assert _request(1, body=None).dialect is None
    assert _request(1, body={"__raw_text__": "not json"}).dialect is None
    assert _request(1, "/v1/models", "GET", body=None).dialect is None
    assert _request(1, "/v1/chat/completions", body={"messages": []}).dialect == "chat"


def test_only_the_headers_that_decide_the_body_are_kept():
    headers = {"Content-Type": "application/json", "Authorization": "Bearer secret",
               "anthropic-beta": "x", "User-Agent": "codex"}  # fmt: skip
    assert session_file.kept_headers(headers) == {
        "content-type": "application/json",
        "anthropic-beta": "x",
    }
