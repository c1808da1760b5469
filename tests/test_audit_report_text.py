"""The terminal report: table, findings with evidence, determinism, verdict."""

from __future__ import annotations

from sluice.audit.records import COMPLETIONS, AuditResult, Finding, ScenarioResult, Target
from sluice.audit.report_text import render_text
from sluice.audit.summary import summarize_audit
from tests.broken_servers import completion_chunk, recorded, sse, usage_chunk


def result_with(findings: list[Finding], labels: tuple[str, ...] = ("server",)) -> AuditResult:
    body = {"model": "m", "prompt": "p", "stream": True, "stream_options": {"include_usage": True}}
    results = []
    for label in labels:
        stream = recorded(
            COMPLETIONS,
            body,
            sse(completion_chunk(0, "hi", "length"), usage_chunk("completion", 1, 2)),
        )
        stream.target = label
        results.append(ScenarioResult("usage", label, 0.0, 1.0, exchanges=[stream]))
    results[0].findings = findings
    targets = [Target(label, f"http://{label}", "m") for label in labels]
    return AuditResult(targets, "quick", ["usage"], results, "2026-01-01T00:00:00+00:00", 1.0)


def test_a_clean_run_prints_the_table_and_passes():
    result = result_with([])
    text = render_text(result, summarize_audit(result))
    assert "TTFT ms p50/90/99" in text
    assert "\nusage " in text and "\nall " in text
    assert "Findings: none." in text
    assert "[server] 0/0 streams equal" in text
    assert text.rstrip().endswith("PASS: no invariant broken.")


def frozen(response_id: int, message: str, cause: str = "completion_tokens repeated") -> Finding:
    return Finding(
        "usage_frozen", "extension", "usage", "server", message, case="usage/continuous",
        request='{"model":"m"}', chunk_numbers=[3, 7], evidence=['#3: data: {"usage": 1}'],
        cause=cause, response_id=response_id,
    )  # fmt: skip


def test_findings_are_grouped_by_cause_with_every_message_the_requests_and_one_example():
    findings = [
        frozen(1, "completion_tokens repeated on 2 chunks"),
        frozen(2, "completion_tokens repeated on 5 chunks"),
        frozen(2, "completion_tokens repeated on 5 chunks"),
        frozen(3, "completion_tokens fell back", cause="completion_tokens fell"),
    ]
    result = result_with(findings)
    text = render_text(result, summarize_audit(result))
    assert "Findings: 2 causes in 1 checks (3 requests); 0 note causes." in text
    assert (
        "  [extension] usage_frozen: completion_tokens repeated\n    2 requests (server 2)" in text
    )
    assert (
        "    · completion_tokens repeated on 2 chunks\n    · completion_tokens repeated on 5 chunks\n"
        in text
    )
    assert text.count("example [server] usage/continuous chunks 3,7") == 2
    assert 'request: {"model":"m"}' in text and '#3: data: {"usage": 1}' in text
    assert "FAIL: 2 causes in 1 checks (3 requests): usage_frozen." in text


def test_each_check_prints_its_coverage_and_an_idle_check_says_so():
    result = result_with([])
    text = render_text(result, summarize_audit(result))
    assert "  usage_placement: server 1/1\n" in text
    assert "  logprob_alignment: server 0/1  (nothing to check)" in text


def test_notes_do_not_fail_the_run():
    note = Finding("text_mismatch_nonstream", "note", "usage", "server", "differs at character 3")
    result = result_with([note])
    summary = summarize_audit(result)
    assert summary.exit_status == 0
    text = render_text(result, summary)
    assert "Findings: nothing broken; 1 note causes." in text
    assert "  [note] text_mismatch_nonstream: differs at character N" in text
    assert "PASS" in text


def test_compare_mode_adds_a_ratio_row_under_each_scenario():
    result = result_with([], labels=("A", "B"))
    text = render_text(result, summarize_audit(result))
    assert "usage [A]" in text and " [B]" in text
    assert text.count("  B/A") == 2  # usage and all


def test_the_determinism_scenario_figure_is_reported_beside_the_stream_figure():
    result = result_with([])
    figures = {"probes_compared": 4.0, "tokens_equal": 3.0, "logprobs_equal": 1.0}
    result.results.append(ScenarioResult("determinism", "server", 1.0, 2.0, figures=figures))
    result.scenarios.append("determinism")
    text = render_text(result, summarize_audit(result))
    assert (
        "[server] alone vs inside a crowd: tokens equal in 3/4 probes, "
        "tokens and logprobs in 1/4" in text
    )
    assert text.rstrip().endswith("PASS: no invariant broken.")
