"""`sluice audit`, quick profile sized for CI, against `sluice serve` on the embedded model.

The server runs as users run it: `python -m sluice.cli serve` in its own
process (the engine in a process of its own below it) on a free port (port 0,
the bound address read from its log), the embedded model converted once by
the session's `embedded_model_config`. The audit runs in this process through
`sluice.audit.cli.main`, every scenario of the quick profile with sizes small
enough for a loaded 2-core CPU (a few tokens/s per stream), and must pass: exit
status 0, no broken invariant in its JSON (determinism notes aside), every
scenario measured, and an HTML page whose plots are drawn.

Invariants: the server is always stopped (SIGTERM, then SIGKILL of its whole
process group) when the module ends, whatever happened; its log is shown
when it fails to start.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from xml.etree import ElementTree

import pytest

from sluice.audit.options import PROFILE_SCENARIOS
from sluice.config import ModelConfig
from tests.audit_runs import PATIENT_SERVE_FLAGS, AuditRun, run_quick_audit
from tests.sluice_server import RunningServer, running_server

pytestmark = pytest.mark.slow

QUICK_SCENARIOS = PROFILE_SCENARIOS["quick"]
PLOT_TITLES = [
    "Time to first token (CDF)",
    "Inter-token latency (CDF)",
    "End-to-end latency (CDF)",
    "Output throughput over time",
    "Tokens per chunk",
]


@pytest.fixture(scope="module")
def audited_server(
    embedded_model_config: ModelConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_server(embedded_model_config, tmp_path_factory, *PATIENT_SERVE_FLAGS) as server:
        yield server


@pytest.fixture(scope="module")
def quick_audit(
    audited_server: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> AuditRun:
    out = tmp_path_factory.mktemp("audit")
    return run_quick_audit(audited_server.base_url, audited_server.model, out)


def test_the_quick_audit_of_sluice_passes_with_no_finding(quick_audit: AuditRun):
    """No broken invariant. The default (bfloat16) is not batch-invariant, so a
    stream and its non-streamed twin, computed in different batches, may
    differ: that is the determinism figure, reported as a note (issue 16)."""
    assert quick_audit.exit_status == 0, quick_audit.text
    assert quick_audit.report["exit_status"] == 0
    assert quick_audit.report["invariants_broken"] is False
    notes = {"text_mismatch_nonstream", "responses_stream_mismatch", "messages_stream_mismatch"}
    assert all(
        f["severity"] == "note" and f["check_id"] in notes for f in quick_audit.report["findings"]
    ), quick_audit.text


def test_every_quick_scenario_ran_and_was_measured(quick_audit: AuditRun):
    report = quick_audit.report
    assert report["profile"] == "quick"
    assert report["scenarios"] == list(QUICK_SCENARIOS)
    metrics = report["metrics"]["server"]
    for scenario in QUICK_SCENARIOS:
        assert metrics[scenario]["requests"] > 0, scenario
        assert metrics[scenario]["errors"] == 0, scenario
    assert metrics["all"]["output_tokens"] > 0
    # Streams were compared with their non-streamed twins.
    assert report["determinism"]["server"]["compared"] > 0


def test_the_html_report_draws_every_plot(quick_audit: AuditRun):
    assert "PASS: no invariant broken" in quick_audit.html
    plots = re.findall(r"<svg.*?</svg>", quick_audit.html, flags=re.DOTALL)
    assert [ElementTree.fromstring(plot).get("aria-label") for plot in plots] == PLOT_TITLES
    assert all("no data" not in plot for plot in plots)
    assert all(plot.count("<polyline") >= 2 for plot in plots[:4])


def test_the_paused_readers_make_sluice_merge(quick_audit: AuditRun):
    """sluice's own coalescing, exercised: the paused chat and completions
    streams (two choices, 20 alternatives a token) outgrow its buffers."""
    figures = quick_audit.report["figures"]["server"]["backpressure"]
    assert figures["merged_chat"] == figures["merged_completions"] == 1, quick_audit.report[
        "merging"
    ]
    assert quick_audit.report["merging"]["server"].startswith("merging achieved on ")
