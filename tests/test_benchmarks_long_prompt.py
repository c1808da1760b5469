"""benchmarks/long_prompt.py: the prompt cut to its length, a process group's memory, one served run."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
long_prompt = importlib.import_module("long_prompt")


def test_the_prompt_repeats_the_text_and_is_cut_to_the_number_of_tokens_asked():
    vocabulary: dict[str, int] = {}

    def encode(text: str) -> list[int]:
        return [vocabulary.setdefault(word, len(vocabulary)) for word in text.split()]

    def decode(ids: list[int]) -> str:
        names = {index: word for word, index in vocabulary.items()}
        return " ".join(names[i] for i in ids)

    prompt, count = long_prompt.prompt_of(10, "one two three", encode, decode)
    assert count == 10
    assert prompt == "one two three one two three one two three one"


# Holds 64 MiB it has written to (every page touched, so resident).
HOLD = "b = bytearray(64 * 2**20); b[::4096] = b'x' * (64 * 2**20 // 4096)"


def test_the_memory_of_a_process_group_sums_every_process_in_it():
    # A parent and its child, each holding 64 MiB, in a session (process group) of their own.
    child = f"import time; {HOLD}; time.sleep(600)"
    script = (
        f"import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        f"{HOLD}\nsys.stdin.read()\nchild.kill()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        memory = long_prompt.GroupMemory(process.pid, interval_s=0.05)
        sizes = (0, 0)
        for _ in range(600):  # until both hold their 64 MiB (bounded)
            sizes = memory.sample()
            if memory.max_processes == 2 and sizes[0] > 128 * 2**20:
                break
            time.sleep(0.05)
        assert memory.max_processes == 2
        assert sizes[0] > 128 * 2**20 and sizes[1] > 120 * 2**20  # one alone: ~64 + 10 MiB
        assert memory.peak[0] >= sizes[0]
        assert memory.window_peak == (0, 0)  # no window started: startup is not the prompt
        memory.start_window()
        assert memory.sample()[0] > 0 and memory.window_peak[0] > 128 * 2**20
    finally:
        process.stdin.close()
        process.wait(timeout=30)


def test_a_server_run_records_startup_ttft_answer_and_its_processes_memory(tmp_path):
    args = argparse.Namespace(
        sample_s=0.05, startup_timeout=120.0, request_timeout=120.0, max_tokens=4
    )
    command = f"{sys.executable} -m sluice.testing.fake_server --port {{port}}"
    result = long_prompt.measure(
        "fake", command, ("hello there, long prompt", 5), args, tmp_path / "fake.log"
    )
    assert result.error is None
    assert result.startup_s is not None and result.ttft_s is not None
    assert result.ttft_s <= result.total_s
    assert result.answer  # the fake engine parrots the prompt
    assert result.num_processes >= 1 and result.peak_rss_mib > 10
    assert result.prompt_peak_rss_mib > 10


def test_a_server_that_cannot_start_is_an_error_with_its_log(tmp_path):
    args = argparse.Namespace(
        sample_s=0.05, startup_timeout=60.0, request_timeout=60.0, max_tokens=4
    )
    command = f"{sys.executable} -c \"print('no such model'); raise SystemExit(2)\" {{port}}"
    result = long_prompt.measure("broken", command, ("x", 1), args, tmp_path / "broken.log")
    assert result.error is not None and "no such model" in result.error
    assert result.ttft_s is None


def test_the_sluice_command_is_the_default_serve_on_the_file_and_llama_server_gets_its_flags():
    args = long_prompt.build_parser().parse_args(
        ["--model", "/m/8b.gguf", "--llama-server", "/bin/llama-server"]
    )
    commands = dict(long_prompt.server_commands(args))
    assert commands["sluice"].endswith("serve --model /m/8b.gguf --host 127.0.0.1 --port {port}")
    assert commands["llama-server"].endswith(
        "-m /m/8b.gguf --host 127.0.0.1 --port {port} -t 2 -c 17000"
    )
