"""Inline SVG charts: valid XML, one line per series, readable ticks."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

from sluice.audit.svg import Band, Series, bar_chart, line_chart, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


def test_ticks_are_round_numbers_covering_the_range():
    assert nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0, 0.37)[:3] == [0, 0.1, 0.2]
    assert nice_ticks(5, 5)[0] == 5


def test_a_line_chart_is_valid_svg_with_one_polyline_per_series_and_its_legend():
    chart = line_chart(
        "Latency <p50>",
        [Series("A & co", [0, 1, 2], [0, 0.5, 1]), Series("B", [0, 2], [0, 1], "#d62728")],
        "ms",
        "share",
        is_step=True,
        bands=[Band(0, 1, "lag")],
    )
    root = ElementTree.fromstring(chart)
    assert root.tag == f"{SVG}svg"
    # The axes, then one line per series.
    assert len(root.findall(f"{SVG}polyline")) == 3
    texts = [element.text for element in root.iter(f"{SVG}text")]
    assert "Latency <p50>" in texts and "A & co" in texts and "lag" in texts


def test_a_chart_without_data_says_so():
    assert "no data" in line_chart("Empty", [Series("A", [], [])], "x", "y")
    assert "no data" in bar_chart("Empty", [], [], "x", "y")


def test_a_bar_chart_draws_one_bar_per_category_and_series():
    chart = bar_chart(
        "Tokens",
        ["1", "2", "3"],
        [Series("A", [], [50, 30, 20]), Series("B", [], [10, 0, 90])],
        "n",
        "%",
    )
    root = ElementTree.fromstring(chart)
    bars = [rect for rect in root.iter(f"{SVG}rect") if rect.find(f"{SVG}title") is not None]
    assert len(bars) == 6
