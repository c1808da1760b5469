"""Evidence: readable, truncated raw bytes; one finding per response and check;
every check id the code reports is in the catalogue."""

from __future__ import annotations

import re
from pathlib import Path

from sluice.audit.checks.catalogue import CHECKS
from sluice.audit.checks.evidence import (
    cause_of,
    escape_bytes,
    finding,
    merge_findings,
    request_text,
)
from sluice.audit.records import CHAT
from tests.broken_servers import recorded

AUDIT_SOURCE = Path(__file__).resolve().parents[1] / "sluice" / "audit"


def test_raw_bytes_keep_utf8_and_show_line_endings_and_invalid_bytes():
    assert escape_bytes(b'data: {"t":"\xe6\x9d\xb1"}\r\n\n') == 'data: {"t":"東"}\\r\\n\\n'
    assert escape_bytes(b"\xf0\x9f") == "\\xf0\\x9f"


def test_long_events_keep_their_head_and_tail():
    quoted = escape_bytes(b"a" * 1000 + b"END", limit=100)
    assert quoted.startswith("a" * 75) and quoted.endswith("END") and "bytes]…" in quoted
    assert len(quoted) < 200


def test_requests_are_quoted_as_json_and_truncated():
    exchange = recorded(
        CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}, b""
    )
    text = request_text(exchange)
    assert text.startswith('{"model":"m"') and text.endswith("chars]") and len(text) < 800


def test_findings_of_one_check_and_cause_on_one_response_merge_keeping_every_message():
    exchange = recorded(CHAT, {"model": "m"}, b"")
    merged = merge_findings(
        [
            finding("empty_chunk", exchange, "1 empty chunks on index 0", [3], evidence=["#3"]),
            finding("empty_chunk", exchange, "2 empty chunks on index 1", [1, 3], evidence=["#1"]),
            finding("role_repeated", exchange, "c", [2], evidence=[]),
        ]
    )
    assert [(f.check_id, f.chunk_numbers, f.evidence) for f in merged] == [
        ("empty_chunk", [1, 3], ["#3", "#1"]),
        ("role_repeated", [2], []),
    ]
    assert merged[0].message == "1 empty chunks on index 0 | 2 empty chunks on index 1"
    assert merged[0].cause == "N empty chunks on index N"


def test_two_causes_of_one_check_on_one_response_stay_two_findings():
    exchange = recorded(CHAT, {"model": "m"}, b"")
    merged = merge_findings(
        [
            finding("id_changed", exchange, "created changed: 1 then 2", [1]),
            finding("id_changed", exchange, "model changed: 'a' then 'b'", [2]),
        ]
    )
    assert [f.cause for f in merged] == ["created changed: N then N", "model changed: … then …"]


def test_a_cause_blanks_numbers_and_quoted_texts_but_keeps_names():
    message = "differs at character 360: streamed 'a\\'b', non-streamed b'\\x01' in model_9"
    assert cause_of(message) == "differs at character N: streamed …, non-streamed … in model_9"


def test_every_check_id_the_code_reports_is_in_the_catalogue():
    pattern = re.compile(r'(?:finding|scenario_finding)\(\s*"([a-z0-9_]+)"')
    reported = {
        match for path in AUDIT_SOURCE.rglob("*.py") for match in pattern.findall(path.read_text())
    }
    assert len(reported) > 30
    assert reported <= set(CHECKS)
