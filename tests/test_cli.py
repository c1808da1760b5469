"""The `sluice` command: flags become one frozen config tree; load errors are one line."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from sluice.cli import build_parser, main, parse_size, server_config_from
from sluice.config import RequestLimits


def test_sizes_read_binary_and_decimal_units():
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("1.5kb") == 1500
    assert parse_size("1000") == 1000
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")


def test_serve_flags_become_the_config_tree():
    args = build_parser().parse_args(
        [
            "serve",
            "--port",
            "9001",
            "--kv-cache-memory",
            "256MiB",
            "--max-num-seqs",
            "8",
            "--no-chunked-prefill",
            "--in-process",
            "--cors-allowed-origins",
            "http://a,http://b",
            "--max-n",
            "4",
            "--max-stop-string-chars",
            "64",
            "--max-chat-messages",
            "7",
            "--max-request-body",
            "1MiB",
            "--on-engine-death",
            "exit",
            "--dtype",
            "bfloat16",
            "--num-threads",
            "1",
        ]
    )
    config = server_config_from(args)
    assert config.port == 9001
    assert config.cors_allowed_origins == ("http://a", "http://b")
    assert config.limits.max_n == 4
    assert config.limits.max_stop_string_chars == 64
    assert config.limits.max_chat_messages == 7
    assert config.limits.max_request_body_bytes == 1 << 20
    assert config.on_engine_death == "exit"
    assert config.engine.multiprocess is False
    assert config.engine.cache.kv_cache_memory_bytes == 256 << 20
    assert config.engine.scheduler.max_num_seqs == 8
    assert config.engine.scheduler.enable_chunked_prefill is False
    assert config.engine.model.dtype == "bfloat16"
    assert config.engine.num_threads == 1


def test_the_limit_flags_default_to_the_config_defaults():
    limits = server_config_from(build_parser().parse_args(["serve"])).limits
    assert limits == RequestLimits()


def test_a_bad_model_path_is_one_error_line_and_exit_status_2(tmp_path, capsys):
    status = main(["generate", "--model", str(tmp_path / "nowhere"), "--prompt", "hi"])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.startswith("sluice: error: ")
    assert "nowhere" in err
    assert "\n" not in err


@pytest.mark.slow
def test_generate_prints_the_embedded_models_answer(embedded_model_config):
    command = [
        sys.executable,
        "-m",
        "sluice.cli",
        "generate",
        "--cache-dir",
        str(embedded_model_config.cache_dir),
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "12",
        # float32: the first token of this answer is a near tie (0.08 nats
        # between "The" and "L"), which bfloat16 rounding may flip.
        "--dtype",
        "float32",
        "--quantization",
        "none",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    assert "Paris" in result.stdout


def test_batch_invariant_mode_is_off_unless_asked():
    assert not server_config_from(build_parser().parse_args(["serve"])).engine.model.batch_invariant
    asked = server_config_from(build_parser().parse_args(["serve", "--batch-invariant"]))
    assert asked.engine.model.batch_invariant
