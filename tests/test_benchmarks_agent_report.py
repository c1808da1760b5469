"""benchmarks/_agent_report.py: the per-server table, its goal checks, the side-by-side
table and the plot, from hand-built measurements (no server)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
run = importlib.import_module("_agent_replay_run")
report = importlib.import_module("_agent_report")
sse = importlib.import_module("_agent_sse")


def _m(phase, turn, ttft, prompt=None, cached=None, index=1, error=None):
    facts = sse.StreamFacts(first_content_s=ttft, num_prompt_tokens=prompt,
                            num_cached_tokens=cached, error=error)  # fmt: skip
    return run.Measured(phase, turn, index, "responses", facts, wall_s=ttft or 0.0)


def _result():
    return report.ServerResult("sluice", [
        _m("cold", 1, 4.0, 4600, 0), _m("cold", 2, 0.30, 4650, 4592),
        _m("warm", 1, 0.12, 4600, 4592), _m("warm", 2, 0.10, 4650, 4640),
        _m("restart", 1, 0.15, 4600, 4592), _m("restart", 2, 0.20, 4650, 4592),
        _m("prefill:cold", 1, 3.5, 4600, 0), _m("prefill:cold", 2, 0.25, 58, 0),
        _m("prefill:warm", 1, 0.10, 8, 0), _m("prefill:warm", 2, 0.10, 10, 0),
    ])  # fmt: skip


def test_a_server_table_has_one_row_per_request_with_its_ratios():
    table = report.server_table(_result())
    rows = [line for line in table.splitlines() if line.startswith("| 1.") or
            line.startswith("| 2.")]  # fmt: skip
    assert rows[0] == ("| 1.1 | 4600 | 4.000 (0) | 3.500 | 1.14x | 0.120 (4592) | 0.100 | 1.20x "
                       "| 0.150 (4592) | 1.25x |")  # fmt: skip
    assert rows[1] == ("| 2.1 | 4650 | 0.300 (4592) | 0.250 | 1.20x | 0.100 (4640) | 0.100 "
                       "| 1.00x | 0.200 (4592) | 2.00x |")  # fmt: skip


def test_the_goal_line_takes_the_worst_warm_ratio_and_the_first_request_after_restart():
    line = report.goals_line(_result())
    # Turns 2+ of the cold session: only 2.1 (0.30 / 0.25); the warm session: 1.20 worst.
    assert "turns 2+ of the cold session 1.20x" in line
    assert "repeated (warm) session 1.20x" in line
    assert "after the restart / warm 1.25x" in line


def test_a_note_follows_the_goal_line():
    result = _result()
    result.note = "the restart read nothing"
    assert report.server_table(result).rstrip().endswith("Note: the restart read nothing")


def test_a_failed_request_shows_as_an_error_not_a_time():
    result = report.ServerResult("peer", [_m("cold", 1, None, error="HTTP 400")])
    assert "| 1.1 | - | error |" in report.server_table(result)


def test_a_skipped_server_says_why():
    result = report.ServerResult("vllm-cpu", [], skipped="not installed")
    assert report.server_table(result) == "**vllm-cpu**: not measured (not installed)\n"


def test_side_by_side_has_a_column_per_server_and_phase():
    other = report.ServerResult("llama", [_m("cold", 1, 9.0), _m("warm", 1, 0.5)])
    table = report.side_by_side([_result(), other, report.ServerResult("x", [], "absent")])
    lines = table.splitlines()
    assert lines[0] == ("| turn | sluice cold | sluice warm | sluice restart | llama cold "
                        "| llama warm | llama restart |")  # fmt: skip
    assert lines[2] == "| 1.1 | 4.000 | 0.120 | 0.150 | 9.000 | 0.500 | - |"
    assert lines[3] == "| 2.1 | 0.300 | 0.100 | 0.200 | - | - | - |"


def test_sluice_is_ahead_on_a_request_only_when_faster_than_every_peer():
    llama = report.ServerResult("llama", [_m("cold", 1, 9.0), _m("cold", 2, 0.2),
                                          _m("warm", 1, 0.5), _m("warm", 2, 0.05)])  # fmt: skip
    vllm = report.ServerResult("vllm", [_m("cold", 1, 3.0)])
    line = report.ahead_line([_result(), llama, vllm])
    # cold 1.1: 4.0 vs 3.0 (vllm) lost; 2.1: 0.30 vs 0.2 lost; warm 1.1 won, 2.1 lost;
    # restart: no peer time, so sluice's answer counts.
    assert line == "Ahead of every peer (goal: all): 0 of 2 cold, 1 of 2 warm, 2 of 2 restart."
    assert report.ahead_line([_result()]) == "Ahead of the peers: no peer measured."


def test_the_plot_draws_a_line_per_server_and_phase():
    svg = report.plot_svg("codex", [_result()])
    assert svg.startswith("<svg") and svg.count('stroke-width="1.8"') == 3
    assert "sluice restart" in svg
