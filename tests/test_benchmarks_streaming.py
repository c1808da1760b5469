"""benchmarks/streaming.py and _sse_reference.py: a tiny run, and checks that bite.

One module-scoped run (fake tokenizer, 2 streams of 20 tokens per server,
every other stream fully checked) against sluice and a reference told to send
one event twice: sluice's figures come out and its checked stream passes; the
reference's plain stream is measured and its checked stream fails. The checks
themselves are also run on hand-built bodies, without servers.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # streaming.py imports its sibling
reference = importlib.import_module("_sse_reference")
streaming = importlib.import_module("streaming")

MAX_TOKENS = 20


@pytest.fixture(scope="module")
def workload():
    return reference.build_workload(reference.load_tokenizer("fake", ROOT), MAX_TOKENS)


@pytest.fixture(scope="module")
def report():
    config = streaming.BenchConfig(
        concurrencies=(2,),
        max_tokens=MAX_TOKENS,
        duration_s=0.0,  # one stream per worker
        sample_every=2,
        tokenizer="fake",
        break_reference=True,
        request_timeout_s=30.0,
    )
    return streaming.run_benchmark(config)


def body_of(workload, shape, duplicate_at: int | None = None) -> bytes:
    events = reference.build_events(workload, shape)
    if duplicate_at is not None:
        events.insert(duplicate_at, events[duplicate_at])
    return b"".join(events)


SAMPLED = reference.StreamShape(MAX_TOKENS, True, True, True)
PLAIN = reference.StreamShape(MAX_TOKENS, False, True, False)


def test_the_workload_is_the_parroted_prompt_token_by_token(workload):
    assert workload.max_tokens == MAX_TOKENS
    assert "".join(workload.token_texts) == workload.expected_text
    assert all(workload.token_texts)


def test_an_intact_stream_passes_the_full_check_and_counts_its_chunks(workload):
    assert reference.check_sampled(body_of(workload, SAMPLED), workload) == MAX_TOKENS
    assert reference.count_plain(body_of(workload, PLAIN), workload) == MAX_TOKENS


def test_the_full_check_catches_one_delta_sent_twice(workload):
    for position in (0, 5, MAX_TOKENS - 1):
        with pytest.raises(AssertionError):
            reference.check_sampled(body_of(workload, SAMPLED, position), workload)


def test_the_plain_count_refuses_a_stream_without_done_or_with_short_usage(workload):
    body = body_of(workload, PLAIN)
    with pytest.raises(AssertionError, match="DONE"):
        reference.count_plain(body[: -len(reference.DONE_EVENT)], workload)
    short = reference.StreamShape(MAX_TOKENS - 1, False, True, False)
    with pytest.raises(AssertionError, match="usage"):
        reference.count_plain(body_of(workload, short), workload)


def test_sluice_is_measured_and_its_checked_stream_passes(report):
    (sluice,) = [level for level in report.levels if level.server == "sluice"]
    assert sluice.num_streams == 2 and sluice.num_failures == 0, sluice.failures
    assert sluice.num_checked == 1
    assert sluice.num_tokens == 2 * MAX_TOKENS
    assert 0 < sluice.num_chunks <= sluice.num_tokens
    assert sluice.tokens_per_s > 0 and sluice.chunks_per_s > 0 and sluice.wall_s > 0
    assert sluice.server_cpu_s >= 0 and sluice.client_cpu_s > 0


def test_the_broken_reference_is_measured_but_fails_its_checked_stream(report):
    (ref,) = [level for level in report.levels if level.server == "reference"]
    assert ref.num_streams == 2 and ref.num_checked == 0
    assert ref.num_failures == 1 and "AssertionError" in ref.failures[0]
    assert ref.num_tokens == MAX_TOKENS and ref.tokens_per_s > 0
    assert report.ratio(2) == pytest.approx(report.levels[0].tokens_per_s / ref.tokens_per_s)


def test_the_table_and_json_report_every_figure(report):
    table = streaming.render_table(report)
    assert "FAILED reference @2: AssertionError" in table
    assert "target: sluice >= 50%" in table
    figures = json.loads(json.dumps(streaming.report_json(report)))
    assert {level["server"] for level in figures["levels"]} == {"sluice", "reference"}
    assert figures["ratios"]["2"] == pytest.approx(report.ratio(2))
    assert figures["engine_tokens_per_s"] > 0 and figures["tokenizer"] == "fake"
    assert figures["passed"] is False  # a failed check never passes
