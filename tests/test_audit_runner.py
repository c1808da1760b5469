"""Preflight, interleaving in compare mode, and checking shared twins once."""

from __future__ import annotations

import asyncio

from sluice.audit.options import AuditOptions
from sluice.audit.records import COMPLETIONS, ScenarioResult, Target
from sluice.audit.runner import check_result, preflight, run_audit
from tests.broken_servers import MODEL, completion_chunk, recorded, serving, sse


def test_preflight_warns_about_an_unlisted_model_and_fails_on_an_unreachable_server():
    with serving() as url:
        report = asyncio.run(preflight([Target("A", url, MODEL), Target("B", url, "other-model")]))
    assert report.errors == []
    assert report.warnings == [f"{url}: model 'other-model' is not in /v1/models"]
    unreachable = asyncio.run(preflight([Target("A", "http://127.0.0.1:9", MODEL)]))
    assert len(unreachable.errors) == 1 and "unreachable" in unreachable.errors[0]


def test_compare_mode_alternates_which_server_goes_first():
    with serving() as url_a, serving() as url_b:
        targets = [Target("A", url_a, MODEL), Target("B", url_b, MODEL)]
        options = AuditOptions(scenarios=("usage", "bad_inputs", "usage"))
        result = asyncio.run(run_audit(targets, options))
    assert [(r.scenario, r.target) for r in result.results] == [
        ("usage", "A"),
        ("usage", "B"),
        ("bad_inputs", "B"),
        ("bad_inputs", "A"),
        ("usage", "A"),
        ("usage", "B"),
    ]
    starts = [r.started_s for r in result.results]
    assert starts == sorted(starts)


def test_a_twin_shared_by_many_streams_is_checked_once():
    broken_twin = recorded(COMPLETIONS, {"model": "m", "prompt": "p"}, b"oops", status=500)
    body = {"model": "m", "prompt": "p", "stream": True}
    streams = [
        recorded(COMPLETIONS, body, sse(completion_chunk(0, "hi", "length")), twin=broken_twin)
        for _ in range(3)
    ]
    result = ScenarioResult("lag", "server", 0.0, 1.0, exchanges=streams)
    check_result(result)
    assert [f.check_id for f in result.findings] == ["server_error_5xx"]


def test_strict_rules_are_reported_only_with_strict():
    raw = b": ping\n\n" + sse(completion_chunk(0, "hi", "stop"))
    body = {"model": "m", "prompt": "p", "stream": True}

    def checked(strict: bool) -> list[str]:
        result = ScenarioResult("unit", "server", 0.0, 1.0, [recorded(COMPLETIONS, body, raw)])
        check_result(result, strict=strict)
        return [finding.check_id for finding in result.findings]

    assert checked(False) == []
    assert checked(True) == ["comment_line"]
