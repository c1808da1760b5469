"""The command line: exit statuses, --json, --html and compare mode, end to end
against the scripted servers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from sluice.audit.cli import build_parser, main, options_from
from tests.broken_servers import MODEL, Defect, serving

SMALL = [
    "--lag-streams",
    "4",
    "--lag-long-prompts",
    "1",
    "--lag-long-prompt-words",
    "100",
    "--quiet",
]


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_server_exits_with_status_2(capsys):
    assert main(["--base-url", closed_port_url(), "--model", MODEL, "--quiet"]) == 2
    assert "unreachable" in capsys.readouterr().err


def test_usage_errors_exit_with_status_2(capsys):
    assert main(["--model", MODEL]) == 2
    assert main(["--base-url", "http://x", "--model", MODEL, "--scenarios", "lag,nope"]) == 2
    assert main(["--base-url", "http://x", "--model", MODEL, "--lag-streams", "-1"]) == 2
    assert main(["--base-url", "http://x"]) == 2  # argparse: --model is required
    assert "unknown scenarios ['nope']" in capsys.readouterr().err


def test_help_exits_0_and_lists_the_sizing_flags(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--lag-slow-share" in out and "--soak-duration-s" in out and "(quick 8, full 48)" in out


def test_json_report_parses_and_holds_the_figures(tmp_path: Path, capsys):
    out = tmp_path / "audit.json"
    with serving() as url:
        status = main(
            [
                "--base-url",
                url + "/v1/",
                "--model",
                MODEL,
                "--scenarios",
                "lag,logprobs",
                "--json",
                str(out),
                *SMALL,
            ]
        )
    assert status == 0
    report = json.loads(out.read_text())
    assert report["exit_status"] == 0 and report["findings"] == []
    lag = report["metrics"]["server"]["lag"]
    assert lag["ttft_s"]["p50"] > 0 and lag["itl_s"]["p99"] >= lag["itl_s"]["p50"]
    assert lag["output_tokens_per_s"] > 0 and lag["tokens_per_chunk"] > 1
    assert report["determinism"]["server"]["compared"] > 0
    assert sum(report["tokens_per_chunk"]["server"].values()) > 0
    assert max(report["timeline"]["server"]["tokens_per_s"]) > 0
    assert "PASS" in capsys.readouterr().out


def test_a_broken_server_exits_1_and_the_json_names_the_check(tmp_path: Path):
    out = tmp_path / "audit.json"
    with serving(Defect.DONE_MISSING) as url:
        status = main(
            [
                "--base-url",
                url,
                "--model",
                MODEL,
                "--scenarios",
                "usage",
                "--json",
                str(out),
                "--quiet",
            ]
        )
    assert status == 1
    report = json.loads(out.read_text())
    assert set(report["findings_by_check"]) == {"done_missing"}
    assert report["findings"][0]["evidence"]


def test_html_report_is_one_self_contained_file_with_svg_plots(tmp_path: Path):
    out = tmp_path / "audit.html"
    with serving() as url:
        assert (
            main(
                [
                    "--base-url",
                    url,
                    "--model",
                    MODEL,
                    "--scenarios",
                    "logprobs,usage",
                    "--html",
                    str(out),
                    "--quiet",
                ]
            )
            == 0
        )
    page = out.read_text()
    assert page.count("<svg") >= 5
    # Nothing fetched from elsewhere: no scripts, stylesheets, images or fonts by reference.
    for reference in ("<script", "<link", "src=", "href=", "@import", "url("):
        assert reference not in page


def test_compare_mode_runs_both_servers_interleaved_and_reports_ratios(tmp_path: Path, capsys):
    out, page = tmp_path / "compare.json", tmp_path / "compare.html"
    with serving() as url_a, serving() as url_b:
        args = [
            "--compare",
            url_a,
            url_b,
            "--model",
            MODEL,
            "--scenarios",
            "logprobs,usage,choices",
        ]
        assert main([*args, "--json", str(out), "--html", str(page), *SMALL]) == 0
    report = json.loads(out.read_text())
    assert [t["label"] for t in report["targets"]] == ["A", "B"]
    assert 0.1 < report["ratios"]["logprobs"]["ttft_p50_s"] < 10
    assert report["ratios"]["all"]["output_tokens_per_s"] is not None
    assert "B/A" in capsys.readouterr().out and "B/A" in page.read_text()


def test_python_dash_m_sluice_audit_runs_standalone():
    done = subprocess.run(
        [sys.executable, "-m", "sluice.audit", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "--compare" in done.stdout


def test_extensions_are_probed_by_default_and_strict_rules_are_asked_for():
    default = options_from(build_parser().parse_args(["--model", MODEL]))
    assert (default.vllm_extensions, default.strict) == ("auto", False)
    chosen = options_from(
        build_parser().parse_args(["--model", MODEL, "--vllm-extensions", "off", "--strict"])
    )
    assert (chosen.vllm_extensions, chosen.strict) == ("off", True)
    assert main(["--base-url", "http://x", "--model", MODEL, "--vllm-extensions", "yes"]) == 2


def test_a_json_report_holds_the_causes_and_each_checks_coverage(tmp_path: Path):
    with serving(Defect.ROLE_REPEATED) as url:
        status = main(
            ["--base-url", url, "--model", MODEL, "--scenarios", "usage", "--json",
             str(tmp_path / "a.json"), *SMALL]
        )  # fmt: skip
    report = json.loads((tmp_path / "a.json").read_text())
    assert status == 1 and report["schema_version"] == 2
    (cause,) = report["causes"]
    assert (cause["check_id"], cause["severity"]) == ("role_repeated", "break")
    assert cause["requests"]["server"] >= 1 and cause["messages"]
    assert report["coverage"]["by_check"]["usage_placement"]["server"] > 0
