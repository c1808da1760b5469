"""benchmarks/peers.py without a peer: its command lines, statistics, table and run order.

The end-to-end tests play both sluice and a peer with the fake SSE server
(tests/fake_sse_server.py), started from a small executable script that logs
when it starts and stops, so the run order (one server at a time, alternating
per repeat) is checked without a model, vLLM or llama.cpp.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # peers.py imports its siblings
load = importlib.import_module("_load")
peers = importlib.import_module("peers")


def parse(*argv: str):
    return peers.build_parser().parse_args(list(argv))


# ---- arguments and command lines ---------------------------------------------------------


def test_defaults_are_the_issue_workload():
    args = parse()
    assert args.levels == [1, 16, 64] and args.max_tokens == 128
    assert args.long_prompt_tokens == 2000 and args.repeats == 1
    assert args.vllm_venv == Path("/work/peers/vllm") and args.llama_server is None
    assert args.sluice_flags is None  # one variant: `make serve`'s command


def test_levels_parse_and_bad_levels_are_refused(capsys):
    assert parse("--levels", "1, 8,").levels == [1, 8]
    for bad in ("0,4", "x", ","):
        with pytest.raises(SystemExit):
            parse("--levels", bad)
    assert "levels are" in capsys.readouterr().err


def test_check_args_names_what_cannot_run(tmp_path):
    sluice_bin = tmp_path / "sluice"
    sluice_bin.touch()
    assert peers.check_args(parse("--sluice-bin", str(sluice_bin))) is None
    same_twice = parse("--sluice-bin", str(sluice_bin), "--sluice-flags", "", "--sluice-flags", " ")
    assert "same variant" in peers.check_args(same_twice)
    assert "no sluice" in peers.check_args(parse("--sluice-bin", str(tmp_path / "none")))
    no_llama = parse("--sluice-bin", str(sluice_bin), "--llama-server", str(tmp_path / "none"))
    assert "no llama-server" in peers.check_args(no_llama)
    assert "at least 1" in peers.check_args(
        parse("--sluice-bin", str(sluice_bin), "--repeats", "0")
    )


def test_the_default_sluice_command_is_make_serves():
    makefile = (ROOT / "Makefile").read_text()
    host = re.search(r"^HOST \?= (\S+)$", makefile, re.M).group(1)
    recipe = re.search(r"^serve:.*\n\t(.*)$", makefile, re.M).group(1)
    expected = recipe.replace("$(BIN)", ".venv/bin").replace("$(HOST)", host)
    expected = expected.replace("$(PORT)", "{port}")
    assert peers.sluice_command(Path(".venv/bin/sluice"), "") == expected


def test_sluice_variants_append_their_flags_and_are_named_by_them():
    command = peers.sluice_command(Path("/a b/sluice"), "--dtype bfloat16")
    argv = shlex.split(command.replace("{port}", "9"))
    assert argv[:6] == ["/a b/sluice", "serve", "--host", "127.0.0.1", "--port", "9"]
    assert argv[6:] == ["--dtype", "bfloat16"]
    assert peers.sluice_name("") == "sluice"
    assert peers.sluice_name("--dtype bfloat16") == "sluice --dtype bfloat16"


def test_the_vllm_command_uses_both_cores_the_module_and_cpu_memory_share():
    command = peers.vllm_command(Path("/p/vllm"), Path("/m/smol"), "--max-num-seqs 64")
    argv = shlex.split(command.replace("{port}", "9"))
    assert argv[:3] == ["env", "VLLM_CPU_NUM_OF_RESERVED_CPU=0", "HF_HUB_OFFLINE=1"]
    assert argv[3:6] == ["/p/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/m/smol"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.3"
    assert argv[argv.index("--port") + 1] == "9" and argv[-2:] == ["--max-num-seqs", "64"]


def test_servers_are_sluice_variants_then_installed_peers_with_a_slot_per_stream(tmp_path):
    args = parse("--sluice-flags", "", "--sluice-flags", "--dtype bfloat16", "--levels", "1,16")
    args.llama_server = Path("/bin/llama-server")
    servers = peers.build_servers(args, Path("/m"), Path("/g.gguf"))
    assert [(s.name, s.is_sluice) for s in servers] == [
        ("sluice", True),
        ("sluice --dtype bfloat16", True),
        ("vllm-cpu", False),
        ("llama.cpp", False),
    ]
    llama = shlex.split(servers[3].command)
    assert llama[llama.index("-np") + 1] == "16"
    assert llama[llama.index("-c") + 1] == str(16 * (2000 + 128 + 256))
    assert [s.name for s in peers.build_servers(parse(), None, None)] == ["sluice"]


def test_server_order_reverses_every_other_repeat():
    a, b, c = (peers.Server(n, "x", n == "a") for n in "abc")
    assert peers.server_order([a, b, c], 0) == [a, b, c]
    assert peers.server_order([a, b, c], 1) == [c, b, a]
    assert peers.server_order([a, b, c], 2) == [a, b, c]


def test_long_prompts_reach_the_token_count_and_differ_from_their_first_word():
    count_words = lambda text: len(text.split())  # noqa: E731
    measured = peers.long_prompt(count_words, 300, "Measured.")
    warmup = peers.long_prompt(count_words, 300, "Warm-up:")
    assert 300 <= count_words(measured) < 300 + 20  # stops within one line
    assert measured.split()[0] == "Measured." and warmup.split()[0] == "Warm-up:"
    assert peers.long_prompt(count_words, 300, "Measured.") == measured  # same every run
    assert load.PROMPTS[1] in measured


# ---- statistics, medians, ratios, table --------------------------------------------------


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
    result = peers.level_result(4, load.LevelRun(records=records, wall_s=3.0))
    assert (result.num_requests, result.num_errors) == (11, 1)
    assert result.output_tokens_per_s == pytest.approx(10.0)  # 30 tokens over 3 s
    assert result.ttft_p50_s == pytest.approx(0.55)
    assert result.ttft_p90_s == pytest.approx(0.91)
    assert result.itl_p50_s == pytest.approx(0.055)  # two samples per request
    assert result.itl_p90_s == pytest.approx(0.091)
    assert result.first_error == "HTTP 503: busy"
    failed = peers.level_result(1, load.LevelRun(records=records[-1:], wall_s=1.0))
    assert failed.output_tokens_per_s is None and failed.ttft_p50_s is None


def _level(concurrency: int, tokens_per_s: float | None, time_s: float | None):
    times_s = (time_s,) * 4  # TTFT p50, p90, ITL p50, p90
    return peers.LevelResult(concurrency, 8, 0, tokens_per_s, *times_s, None)


def _run(server: str, repeat: int, tokens_per_s: float, time_s: float, long_s: float | None):
    levels = [_level(1, tokens_per_s, time_s), _level(16, 8 * tokens_per_s, 2 * time_s)]
    return peers.ServerRun(server, repeat, "m", levels, long_s)


def test_summaries_take_each_figures_median_over_the_measured_runs():
    runs = [
        _run("s", 0, 10.0, 0.1, 1.0),
        _run("s", 1, 30.0, 0.3, None),
        _run("s", 2, 20.0, 0.4, 3.0),
        peers.ServerRun("s", 3, error="RuntimeError: server exited"),
    ]
    summary = peers.summarize("s", runs)
    assert summary.num_runs == 3
    one, sixteen = summary.levels
    assert (one.concurrency, one.output_tokens_per_s, one.itl_p90_s) == (1, 20.0, 0.3)
    assert (sixteen.output_tokens_per_s, sixteen.num_requests) == (160.0, 24)
    assert summary.long_prompt_ttft_s == pytest.approx(2.0)  # median of the two it has


def _summaries():
    return [
        peers.summarize("sluice", [_run("sluice", 0, 15.0, 0.06, 5.0)]),
        peers.summarize("vllm-cpu", [_run("vllm-cpu", 0, 30.0, 0.03, 2.0)]),
    ]


def test_ratios_are_sluice_over_each_peer_per_level_and_for_the_long_prompt():
    all_ratios = peers.ratios(_summaries(), {"sluice"})
    assert [(r.sluice, r.peer, r.concurrency) for r in all_ratios] == [
        ("sluice", "vllm-cpu", 1),
        ("sluice", "vllm-cpu", 16),
        ("sluice", "vllm-cpu", None),
    ]
    assert all_ratios[0].output_tokens_per_s == pytest.approx(0.5)
    assert all_ratios[0].itl_p50 == pytest.approx(2.0)
    assert all_ratios[2].ttft_p50 == pytest.approx(2.5)
    assert peers.ratios(_summaries(), {"sluice", "vllm-cpu"}) == []  # no peer left


def test_the_table_has_each_server_then_the_ratio_per_level_and_the_long_prompt():
    summaries = _summaries()
    rows = peers.table_rows(summaries, peers.ratios(summaries, {"sluice"}), 2000)
    assert [row[:2] for row in rows] == [
        ("1", "sluice"),
        ("1", "vllm-cpu"),
        ("1", "sluice / vllm-cpu"),
        ("16", "sluice"),
        ("16", "vllm-cpu"),
        ("16", "sluice / vllm-cpu"),
        ("2000-token prompt", "sluice"),
        ("2000-token prompt", "vllm-cpu"),
        ("2000-token prompt", "sluice / vllm-cpu"),
    ]
    assert rows[0][2:] == ("15.0", "60", "60", "60", "60", "0/8")  # times in ms
    assert rows[2][2:7] == ("0.50", "2.00", "2.00", "2.00", "2.00")
    assert rows[8][3] == "2.50"
    lines = peers.format_table(rows).splitlines()
    assert lines[0].split()[:3] == ["C", "server", "tok/s"] and "ITL p90" in lines[0]
    server_column = lines[0].index("server")
    for line, row in zip(lines[1:], rows, strict=False):  # the server names line up
        assert line[server_column:].startswith(row[1] + " "), line
    assert "sluice is better" in lines[-1]


# ---- the command end to end, fake servers for sluice and a peer ---------------------------


def _fake_server_script(tmp_path: Path, events: Path) -> Path:
    """An executable that serves the fake SSE server on the port after --port."""
    script = tmp_path / "fake-server"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.fake_sse_server import serve_forever\n"
        f"events = open({str(events)!r}, 'a')\n"
        "events.write('start\\n'); events.flush()\n"
        "serve_forever(int(sys.argv[sys.argv.index('--port') + 1]))\n"
        "events.write('stop\\n'); events.flush()\n"
    )
    script.chmod(0o755)
    return script


def test_main_runs_one_server_at_a_time_alternating_and_reports_ratios(tmp_path, capsys):
    events = tmp_path / "events"
    fake = _fake_server_script(tmp_path, events)
    gguf = tmp_path / "model.gguf"
    gguf.touch()
    out = tmp_path / "r.json"
    code = peers.main(
        [
            "--sluice-bin", str(fake),
            "--no-vllm",
            "--llama-server", str(fake),
            "--llama-gguf", str(gguf),
            "--levels", "1,2",
            "--max-tokens", "8",
            "--requests-per-stream", "1",
            "--min-requests", "3",
            "--long-prompt-tokens", "0",
            "--warmup", "1",
            "--repeats", "2",
            "--log-dir", str(tmp_path / "logs"),
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    assert events.read_text().split() == ["start", "stop"] * 4  # never two at once
    results = json.loads(out.read_text())
    assert [(r["server"], r["repeat"]) for r in results["runs"]] == [
        ("sluice", 0),
        ("llama.cpp", 0),
        ("llama.cpp", 1),
        ("sluice", 1),
    ]
    levels = results["runs"][0]["levels"]
    assert [(lv["concurrency"], lv["num_requests"]) for lv in levels] == [(1, 3), (2, 3)]
    assert levels[0]["num_errors"] == 1  # the fake answers prompt 2 with a 503
    assert [m["num_runs"] for m in results["medians"]] == [2, 2]
    assert [r["concurrency"] for r in results["ratios"]] == [1, 2, None]
    output = capsys.readouterr().out
    assert "sluice / llama.cpp" in output and "repeat 2/2: llama.cpp" in output
    assert sorted(p.name for p in (tmp_path / "logs").glob("*.log")) == [
        "llama.cpp-0.log",
        "llama.cpp-1.log",
        "sluice-0.log",
        "sluice-1.log",
    ]


def test_a_server_that_exits_early_is_a_failed_run_and_the_next_still_runs(tmp_path, capsys):
    dead = tmp_path / "dead-server"
    dead.write_text(f"#!{sys.executable}\nimport sys\nprint('boom')\nsys.exit(3)\n")
    dead.chmod(0o755)
    events = tmp_path / "events"
    fake = _fake_server_script(tmp_path, events)
    gguf = tmp_path / "model.gguf"
    gguf.touch()
    code = peers.main(
        [
            "--sluice-bin", str(dead),
            "--no-vllm",
            "--llama-server", str(fake),
            "--llama-gguf", str(gguf),
            "--levels", "1",
            "--max-tokens", "4",
            "--min-requests", "1",
            "--long-prompt-tokens", "0",
            "--warmup", "0",
            "--log-dir", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    assert code == 1
    captured = capsys.readouterr()
    assert "exited with code 3" in captured.err and "boom" in captured.err
    assert "llama.cpp" in captured.out and events.read_text().split() == ["start", "stop"]
    assert (tmp_path / "logs" / "peers.json").exists()
