"""The audit's scenarios against the scripted servers of tests/broken_servers.py:
the correct one yields no finding at all, and each broken variant is flagged
with exactly its class of check ids, with evidence that shows it."""

from __future__ import annotations

import asyncio

import pytest

from sluice.audit.options import PROFILE_SCENARIOS, QUICK, AuditOptions, Sizes, with_overrides
from sluice.audit.records import AuditResult, Target
from sluice.audit.runner import run_audit
from sluice.audit.scenarios.disconnect import _running_lines, is_slowdown_a_finding
from sluice.audit.scenarios.stops import choose_stop_cases
from sluice.audit.summary import EXIT_UNVERIFIED, exit_status_of, summarize_audit
from tests.broken_servers import MODEL, Defect, serving

# Small sizes: the scripted server is fast, the checks are what is tested.
SIZES = with_overrides(
    QUICK,
    {
        "lag": {"streams": 6, "long_prompts": 1, "long_prompt_words": 200, "max_tokens": 24},
        "disconnect": {"streams": 4, "max_tokens": 3000, "probe_tokens": 32},
        "backpressure": {"max_tokens": 128, "pause_s": 2.0},
    },
)


def audit(
    defect: Defect,
    scenarios: tuple[str, ...],
    *,
    vllm_extensions: str = "auto",
    sizes: Sizes = SIZES,
    **server: bool,
) -> AuditResult:
    options = AuditOptions(scenarios=scenarios, sizes=sizes, vllm_extensions=vllm_extensions)
    with serving(defect, **server) as url:
        return asyncio.run(run_audit([Target("server", url, MODEL)], options))


def flagged(result: AuditResult) -> set[str]:
    return {finding.check_id for finding in result.findings if finding.is_failure}


def test_the_correct_server_passes_the_whole_quick_profile_without_a_single_finding():
    result = audit(Defect.NONE, PROFILE_SCENARIOS["quick"])
    assert result.findings == []
    assert not result.has_broken_invariant
    streamed = [e for r in result.results for e in r.exchanges if e.is_stream]
    assert len(streamed) > 30
    assert all(e.status == 200 for e in streamed)


def test_the_correct_server_passes_without_vllm_extensions_too():
    result = audit(Defect.NONE, ("stops", "usage"), vllm_extensions="off")
    assert result.findings == []
    bodies = [e.body for r in result.results for e in r.exchanges if e.body]
    assert not any("include_stop_str_in_output" in body for body in bodies)
    assert not any(
        (body.get("stream_options") or {}).get("continuous_usage_stats") for body in bodies
    )


# defect -> (scenarios to run, the check id that must appear, ids allowed beside it)
CASES = {
    Defect.ALIASING: (
        ("logprobs", "usage"),
        "duplicate_delta",
        {
            "skipped_delta",
            "usage_frozen",
            "usage_inexact",
            "usage_continuous_inexact",
            "logprob_count",
        },
    ),
    Defect.SPLIT_UTF8: (("utf8",), "replacement_char", set()),
    Defect.STOP_PREFIX_LEAK: (("stops",), "stop_leak", set()),
    Defect.USAGE_UNREQUESTED: (("usage",), "usage_unrequested", set()),
    Defect.DONE_MISSING: (("usage",), "done_missing", set()),
    Defect.FINISH_TWICE: (("usage", "choices"), "finish_reason_count", set()),
    Defect.ROLE_REPEATED: (("usage",), "role_repeated", set()),
    Defect.LOGPROBS_COPIED: (("logprobs",), "logprob_copied", set()),
    Defect.LOGPROBS_SHIFTED: (("logprobs",), "logprob_greedy_head", set()),
    Defect.LOGPROBS_SHIFTED_WHEN_BACKED_UP: (("lag",), "logprob_greedy_head", set()),
    Defect.DATA_NULL: (("choices",), "data_null", set()),
    Defect.DISCONNECT_KEEPS_GENERATING: (("disconnect",), "disconnect_keeps_generating", set()),
    Defect.BAD_INPUT_500: (("bad_inputs",), "server_error_5xx", set()),
    Defect.BAD_INPUT_422: (("bad_inputs",), "status_422", set()),
}


@pytest.mark.parametrize("defect", list(CASES), ids=lambda defect: defect.value)
def test_each_broken_server_is_flagged_with_exactly_its_class_and_its_evidence(defect: Defect):
    scenarios, expected, allowed = CASES[defect]
    result = audit(defect, scenarios)
    assert expected in flagged(result)
    assert flagged(result) <= {expected} | allowed
    assert result.has_broken_invariant
    finding = next(f for f in result.findings if f.check_id == expected)
    assert finding.message
    if defect is Defect.DISCONNECT_KEEPS_GENERATING:
        # A finding about the server, not one response: the probe figures are the evidence.
        figures = result.results[0].figures
        assert figures["probe_after_s"] > 2 * figures["probe_before_s"]
        return
    assert finding.request and finding.evidence
    if defect not in (Defect.BAD_INPUT_500, Defect.BAD_INPUT_422):
        # Chunk numbers, and the raw bytes of the first of those chunks.
        assert finding.chunk_numbers
        assert finding.evidence[0].startswith(f"#{finding.chunk_numbers[0]}: data: ")


def test_aliasing_is_seen_from_tokens_frozen_usage_and_the_text():
    result = audit(Defect.ALIASING, ("logprobs", "usage"))
    assert not any(f.check_id == "text_mismatch_nonstream" for f in result.findings)
    ids = flagged(result)
    assert {"duplicate_delta", "skipped_delta", "usage_frozen"} <= ids
    duplicate = next(f for f in result.findings if f.check_id == "duplicate_delta")
    frozen = next(
        f for f in result.findings if f.check_id == "usage_frozen" and f.case == duplicate.case
    )
    # The duplicated chunks are the frozen ones: the same anomaly seen two ways.
    assert set(duplicate.chunk_numbers) & set(frozen.chunk_numbers)


def test_split_utf8_evidence_shows_the_replacement_character():
    result = audit(Defect.SPLIT_UTF8, ("utf8",))
    finding = next(f for f in result.findings if f.check_id == "replacement_char")
    assert any("\ufffd" in quote for quote in finding.evidence)


def test_a_leaked_stop_prefix_is_flagged_only_without_include_stop_str_in_output():
    result = audit(Defect.STOP_PREFIX_LEAK, ("stops",))
    leaks = [f for f in result.findings if f.check_id == "stop_leak"]
    assert leaks
    assert all("+include" not in f.case for f in leaks)


def test_bad_inputs_leave_the_correct_server_healthy_and_all_answered_4xx():
    result = audit(Defect.NONE, ("bad_inputs",))
    answers = [e for e in result.results[0].exchanges if e.expects_error]
    assert answers and all(400 <= (e.status or 0) < 500 and e.status != 422 for e in answers)
    assert result.results[0].exchanges[-1].status == 200  # the valid request afterwards


def test_soak_runs_at_the_set_rate_for_the_set_duration():
    sizes = with_overrides(SIZES, {"soak": {"rate": 10.0, "duration_s": 0.5, "max_tokens": 8}})
    with serving(Defect.NONE) as url:
        options = AuditOptions(scenarios=("soak",), sizes=sizes)
        result = asyncio.run(run_audit([Target("server", url, MODEL)], options))
    soak = result.results[0]
    assert len(soak.exchanges) == 5
    starts = sorted(e.sent_s for e in soak.exchanges)
    assert starts[-1] - starts[0] == pytest.approx(0.4, abs=0.15)
    assert result.findings == []


def test_stop_cases_are_cut_from_the_greedy_text_so_they_match():
    text = "Once upon a time, a fox met a cat in Tokyo. They said hello and waved together."
    cases = choose_stop_cases(text)
    assert [case.name for case in cases] == [
        "spanning",
        "first chunk",
        "overlapping",
        "several",
        "late",
    ]
    for case in cases:
        assert all(stop in text and stop.strip() for stop in case.stops)
    first, second = next(c for c in cases if c.name == "overlapping").stops
    assert text.find(first) < text.find(second) < text.find(first) + len(first)
    assert choose_stop_cases("too short") == []


def test_a_deterministic_server_answers_each_probe_alike_alone_and_in_a_crowd():
    result = audit(Defect.NONE, ("determinism",))
    assert result.findings == []
    figures = result.results[0].figures
    assert figures == {"probes_compared": 2.0, "tokens_equal": 2.0, "logprobs_equal": 2.0}
    cases = [exchange.case for exchange in result.results[0].exchanges]
    assert cases.count("determinism/crowd") == 2 * SIZES.determinism.crowd


def test_logprobs_that_change_with_the_batch_are_a_figure_not_a_broken_invariant():
    result = audit(Defect.BATCH_VARIANT, ("determinism",))
    assert not result.has_broken_invariant
    figures = result.results[0].figures
    assert figures == {"probes_compared": 2.0, "tokens_equal": 2.0, "logprobs_equal": 0.0}


def test_alternatives_shifted_only_when_a_slow_reader_makes_chunks_merge_are_seen_in_the_lag():
    """Readers that keep up get one token per chunk (nothing to shift); the lag
    scenario's slow readers, asking for logprobs, make the chunks merge."""
    lag = audit(Defect.LOGPROBS_SHIFTED_WHEN_BACKED_UP, ("lag",))
    shifted = [f for f in lag.findings if f.check_id == "logprob_greedy_head"]
    assert any(f.case == "lag/slow reader" for f in shifted)
    slow = [e for e in lag.results[0].exchanges if e.reader == "slow"]
    assert all(e.body and e.body.get("logprobs") is not None for e in slow)


def test_the_running_gauge_of_llama_server_vllm_and_sglang_is_read():
    metrics = (
        "llamacpp:requests_processing 2\n"
        'vllm:num_requests_running{model_name="m"} 1.0\n'
        "sglang:num_running_reqs 0\n"
    )
    assert [line.split()[0] for line in _running_lines(metrics)] == [
        "llamacpp:requests_processing",
        'vllm:num_requests_running{model_name="m"}',
    ]


def test_a_slower_probe_is_no_finding_when_the_running_gauge_fell_to_zero():
    # llama-server, run beside other work: 0.122 s before, 0.248 s after, its
    # llamacpp:requests_processing back at 0: the streams stopped.
    assert not is_slowdown_a_finding(0.122, 0.248, 2.0, [])
    assert is_slowdown_a_finding(0.122, 0.248, 2.0, None)  # no gauge: the probe decides
    assert is_slowdown_a_finding(0.122, 0.248, 2.0, ["llamacpp:requests_processing 4"])
    assert not is_slowdown_a_finding(0.122, 0.130, 2.0, None)


def test_a_correct_server_merges_under_backpressure_on_every_api_whose_answers_are_long():
    """Chat and completions answers outgrow the paused readers' buffers and
    merge; the script's agent answers (ten tokens) cannot."""
    result = audit(Defect.NONE, ("backpressure",))
    assert result.findings == []
    figures = result.results[0].figures
    assert figures["merged_chat"] == figures["merged_completions"] == 1
    assert figures["merged_streams"] == 2 and figures["paused_streams"] == 4
    line = summarize_audit(result).merging["server"]
    assert line.startswith("merging achieved on 2 of 4 streams (completions 1/1, chat 1/1")


def test_a_server_that_never_merges_leaves_backpressure_not_exercised_which_is_no_pass():
    result = audit(Defect.NONE, ("backpressure",), coalesces=False)
    (finding,) = result.findings
    assert finding.check_id == "backpressure_not_exercised"
    assert "merging achieved on 0 of 4 streams" in finding.message
    assert not result.has_broken_invariant
    assert exit_status_of(result) == EXIT_UNVERIFIED


def test_top_logprobs_copied_within_merged_chunks_are_caught_only_by_the_backpressure():
    """One token per chunk while the reader keeps up: nothing to copy. The
    paused readers make chunks merge, and each token's entry no longer heads
    its alternatives (or repeats another position's)."""
    calm = audit(Defect.LOGPROBS_TOP_COPIED_WHEN_BACKED_UP, ("logprobs",))
    assert calm.findings == []
    result = audit(Defect.LOGPROBS_TOP_COPIED_WHEN_BACKED_UP, ("backpressure",))
    ids = flagged(result)
    assert ids & {"logprob_greedy_head", "logprob_copied"}
    assert ids <= {"logprob_greedy_head", "logprob_copied"}
    assert all(f.case.endswith("paused") for f in result.findings if f.is_failure)


def test_generating_after_a_disconnect_is_caught_by_the_gauge_at_quick_sizes():
    correct = audit(Defect.NONE, ("disconnect",), sizes=QUICK)
    assert correct.findings == []
    result = audit(Defect.DISCONNECT_KEEPS_GENERATING, ("disconnect",), sizes=QUICK)
    gauge = [f for f in result.findings if f.evidence]
    assert gauge and gauge[0].check_id == "disconnect_keeps_generating"
    assert "script_num_requests_running" in gauge[0].evidence[0]


def test_without_a_running_gauge_abort_is_not_verifiable_rather_than_passed():
    result = audit(Defect.NONE, ("disconnect",), sizes=QUICK, exports_gauge=False)
    assert [f.check_id for f in result.findings] == ["abort_not_verifiable"]
    assert exit_status_of(result) == EXIT_UNVERIFIED
