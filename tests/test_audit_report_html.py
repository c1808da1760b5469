"""The HTML report's structure, checked without a browser: one self-contained
page, well-formed inline SVG plots, the findings with their evidence.
(benchmarks/audit_screenshot.sh renders it in headless Chromium.)"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ElementTree
from html.parser import HTMLParser

import pytest

from sluice.audit.options import QUICK, AuditOptions, with_overrides
from sluice.audit.records import AuditResult, Target
from sluice.audit.report_html import render_html
from sluice.audit.runner import run_audit
from sluice.audit.summary import summarize_audit
from tests.broken_servers import MODEL, Defect, serving

VOID_ELEMENTS = {"meta", "br", "hr", "img", "input", "link"}


def run(defects: list[Defect], scenarios: tuple[str, ...]) -> AuditResult:
    sizes = with_overrides(
        QUICK, {"lag": {"streams": 4, "long_prompts": 1, "long_prompt_words": 100}}
    )
    options = AuditOptions(scenarios=scenarios, sizes=sizes)
    with serving(defects[0]) as url_a, serving(defects[-1]) as url_b:
        urls = [url_a, url_b][: len(defects)]
        labels = ["server"] if len(defects) == 1 else ["A", "B"]
        targets = [Target(label, url, MODEL) for label, url in zip(labels, urls, strict=True)]
        return asyncio.run(run_audit(targets, options))


@pytest.fixture(scope="module")
def broken_page() -> str:
    result = run([Defect.ALIASING], ("lag", "logprobs"))
    return render_html(result, summarize_audit(result))


class TagBalance(HTMLParser):
    """Fails on a closing tag that does not match the innermost open one."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag not in VOID_ELEMENTS:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        pass

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, (
            f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        )
        self.open.pop()


def test_the_page_is_balanced_html_that_references_nothing_outside_itself(broken_page: str):
    assert broken_page.startswith("<!DOCTYPE html>")
    checker = TagBalance()
    checker.feed(broken_page)
    assert checker.open == []
    for reference in ("<script", "<link", "src=", "href=", "@import", "url("):
        assert reference not in broken_page


def test_every_plot_is_well_formed_svg_with_drawn_data(broken_page: str):
    plots = re.findall(r"<svg.*?</svg>", broken_page, flags=re.DOTALL)
    titles = [ElementTree.fromstring(plot).get("aria-label") for plot in plots]
    assert titles == [
        "Time to first token (CDF)",
        "Inter-token latency (CDF)",
        "End-to-end latency (CDF)",
        "Output throughput over time",
        "Tokens per chunk",
    ]
    assert all("no data" not in plot for plot in plots)
    assert all(plot.count("<polyline") >= 2 for plot in plots[:4])
    assert plots[4].count("<rect") >= 3


def test_findings_show_their_check_and_escaped_evidence(broken_page: str):
    assert "FAIL: invariants broken" in broken_page
    assert "<code>duplicate_delta</code>" in broken_page
    assert "#3: data: {&quot;id&quot;" in broken_page or "data: {&quot;" in broken_page
    assert "<details>" in broken_page


def test_compare_mode_draws_one_line_per_server_and_a_ratio_row():
    result = run([Defect.NONE, Defect.NONE], ("logprobs",))
    page = render_html(result, summarize_audit(result))
    assert "PASS: no invariant broken" in page
    assert "logprobs B/A" in page
    cdf = re.search(r"<svg[^>]*Time to first token.*?</svg>", page, flags=re.DOTALL).group(0)
    assert cdf.count("<polyline") == 3  # the axes, then A and B
