"""The `sluice` command: flags become one frozen config tree; load errors are one line."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from sluice.cli import build_parser, engine_config_from, main, parse_size, server_config_from
from sluice.config import EngineConfig, RequestLimits, ServerConfig, SpeculativeConfig
from sluice.server.http import launch
from tests.model_factory import build_tiny_model, write_tiny_tokenizer


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


def test_every_flag_left_unset_gives_its_config_default():
    assert server_config_from(build_parser().parse_args(["serve"])) == ServerConfig()
    args = build_parser().parse_args(["generate", "--prompt", "hi"])
    assert engine_config_from(args, multiprocess=False) == EngineConfig(multiprocess=False)


@pytest.fixture
def never_serve(monkeypatch):
    """A serve that got past its flags fails the test instead of serving forever."""

    def run_server(config):
        raise AssertionError(f"the server started with {config}")

    monkeypatch.setattr(launch, "run_server", run_server)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be at least 1, got 0"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be at least 1, got 0"),
        (["--max-waiting-requests", "-64"], "--max-waiting-requests must be at least 0, got -64"),
        (["--block-size", "0"], "--block-size must be at least 1, got 0"),
        (["--kv-cache-memory-fraction", "1.5"], "--kv-cache-memory-fraction must be at most 1"),
        (["--engine-heartbeat-timeout", "0"], "--engine-heartbeat-timeout must be greater than 0"),
        (["--num-threads", "0"], "--num-threads must be at least 1, got 0"),
        (["--max-model-len", "-1"], "--max-model-len must be at least 1, got -1"),
        (["--port", "70000"], "--port must be at most 65535, got 70000"),
        (["--send-timeout", "0"], "--send-timeout must be greater than 0"),
        (["--queue-timeout", "-1"], "--queue-timeout must be greater than 0"),
        (["--max-n", "0"], "--max-n must be at least 1, got 0"),
        (["--max-request-body", "0"], "--max-request-body must be at least 1, got 0"),
        (["--replica-cpus", "-1", "--data-parallel", "2"], "--replica-cpus must be at least 0"),
    ],
)
def test_a_numeric_flag_out_of_range_is_one_error_line_and_status_2(
    flags, message, never_serve, capsys
):
    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"sluice: error: {message}" + err.removeprefix(f"sluice: error: {message}")
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_kv_cache_is_refused_in_one_line_naming_int8(name, never_serve, capsys):
    assert main(["serve", "--kv-cache-dtype", name]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"sluice: error: --kv-cache-dtype {name}: no fp8 KV on CPU serving; it supports int8 (or bf16)\n"
    )


def test_generate_flags_out_of_range_are_refused_before_the_model_loads(tmp_path, capsys):
    nowhere = str(tmp_path / "nowhere")  # loading it would be another error
    assert main(["generate", "--model", nowhere, "--prompt", "hi", "--max-tokens", "0"]) == 2
    assert capsys.readouterr().err == "sluice: error: --max-tokens must be at least 1, got 0\n"
    assert main(["generate", "--model", nowhere, "--prompt", "hi", "--temperature", "-1"]) == 2
    assert "--temperature must be at least 0" in capsys.readouterr().err


# -- load errors and refused prompts: one line, status 2 ------------------------------


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli") / "tiny-llama"
    build_tiny_model("llama_tied", folder)
    write_tiny_tokenizer(folder)  # no chat template
    return folder


def broken(tiny_folder: Path, tmp_path: Path, how: str) -> Path:
    """A copy of the tiny model broken `how`."""
    folder = Path(shutil.copytree(tiny_folder, tmp_path / "broken"))
    weights = folder / "model.safetensors"
    if how == "missing tensor":
        tensors = load_file(weights)
        del tensors["model.norm.weight"]
        save_file(tensors, weights)
    elif how == "truncated weights":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif how == "vocab below the tokenizer's":
        write_tiny_tokenizer(folder, num_tokens=600)  # the model has 512
    return folder


def model_flags(folder: Path) -> list[str]:
    return ["--model", str(folder), "--cache-dir", str(folder.parent / "cache"),
            "--dtype", "float32", "--quantization", "none"]  # fmt: skip


LOAD_ERRORS = [
    # 64 KiB hold 8 blocks of 16 tokens: less than one request of 256.
    ("KV pool too small", ["--kv-cache-memory", "64KiB"], "KV cache holds 128 tokens"),
    ("missing tensor", [], "missing model.norm.weight"),
    ("truncated weights", [], "unreadable weights file"),
    ("vocab below the tokenizer's", [], "the tokenizer has 600 tokens"),
]


@pytest.mark.parametrize(("how", "flags", "message"), LOAD_ERRORS)
def test_generate_on_a_model_that_cannot_load_is_one_error_line(
    how, flags, message, tiny_folder, tmp_path, capsys
):
    folder = broken(tiny_folder, tmp_path, how)
    argv = ["generate", *model_flags(folder), *flags, "--prompt", "hi", "--raw"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prompt", "", "--raw"], "the prompt is empty"),
        (["--prompt", "x" * 300, "--raw"], "the prompt has 300 tokens; max_model_len 256"),
        (["--prompt", "hi"], "tiny-llama has no chat template; add --raw"),
    ],
)
def test_generate_refuses_a_prompt_in_one_error_line(flags, message, tiny_folder, capsys):
    assert main(["generate", *model_flags(tiny_folder), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sluice: error: {message}") and err.count("\n") == 1


def test_generate_continues_a_raw_prompt(tiny_folder, capsys):
    assert main(["generate", *model_flags(tiny_folder), "--prompt", "hi", "--raw",
                 "--max-tokens", "3"]) == 0  # fmt: skip
    assert capsys.readouterr().out


@pytest.mark.parametrize(("how", "flags", "message"), [LOAD_ERRORS[0], LOAD_ERRORS[2]])
def test_serve_whose_engine_cannot_load_is_one_error_line_and_status_2(
    how, flags, message, tiny_folder, tmp_path
):
    """The engine process finds these; they reach the CLI as one line, not as
    uvicorn's startup traceback and status 3."""
    folder = broken(tiny_folder, tmp_path, how)
    command = [sys.executable, "-m", "sluice.cli", "serve", *model_flags(folder), *flags,
               "--port", "0", "--num-threads", "1"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "startup failed" not in result.stderr
    last = result.stderr.splitlines()[-1]
    assert result.stderr.count("sluice: error: ") == 1 and last.startswith("sluice: error: ")
    assert message in last


def test_speculative_config_is_vllms_json_on_by_default_and_none_turns_it_off():
    default = server_config_from(build_parser().parse_args(["serve"])).engine.speculative_config
    assert default == SpeculativeConfig(num_speculative_tokens=16)
    for off in ("none", "off", "None"):
        args = build_parser().parse_args(["serve", "--speculative-config", off])
        assert server_config_from(args).engine.speculative_config is None
    flag = '{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 5}'
    args = build_parser().parse_args(["serve", "--speculative-config", flag])
    assert server_config_from(args).engine.speculative_config == SpeculativeConfig(
        num_speculative_tokens=6, prompt_lookup_min=1, prompt_lookup_max=5
    )


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("{", "not JSON"),
        ("[4]", "must be a JSON object"),
        ('{"method": "eagle"}', "only 'ngram' is served"),
        ('{"num_speculative_tokens": "4"}', "num_speculative_tokens must be an integer"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be at least 1, got 0"),
        ('{"prompt_lookup_min": 4, "prompt_lookup_max": 2}', "must be at most prompt_lookup_max"),
        ('{"draft_model": "x"}', "unknown keys ['draft_model']"),
    ],
)
def test_a_bad_speculative_config_is_one_error_line_and_status_2(
    flag, message, never_serve, capsys
):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--speculative-config", flag])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("sluice serve: error: argument --speculative-config: ") and message in err


def test_the_cache_tiers_flags_and_llama_cpps_cache_ram_in_mib(tmp_path):
    def cache(*flags: str):
        args = build_parser().parse_args(["generate", "--prompt", "hi", *flags])
        return engine_config_from(args, multiprocess=False).cache

    assert cache().kv_offload_bytes is None and cache().kv_cache_dir is None
    assert cache("--kv-offload-bytes", "2GiB").kv_offload_bytes == 2 << 30
    assert cache("--cache-ram", "512").kv_offload_bytes == 512 << 20
    assert cache("--cache-ram", "0").kv_offload_bytes == 0
    assert cache("--cache-ram", "-1").kv_offload_bytes == sys.maxsize
    on_disk = cache("--kv-cache-dir", str(tmp_path), "--kv-cache-dir-bytes", "1GiB")
    assert (on_disk.kv_cache_dir, on_disk.kv_cache_dir_bytes) == (tmp_path, 1 << 30)
    with pytest.raises(SystemExit):
        cache("--cache-ram", "-2")


def test_reasoning_effort_budgets_change_the_efforts_named(never_serve, capsys):
    args = build_parser().parse_args(["serve", "--reasoning-effort-budgets", "low=5,high=none"])
    budgets = server_config_from(args).reasoning_effort_budgets
    assert (budgets.minimal, budgets.low, budgets.medium, budgets.high) == (256, 5, 4096, None)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--reasoning-effort-budgets", "huge=5"])
    assert exit_info.value.code == 2
    assert "--reasoning-effort-budgets: expected EFFORT=TOKENS" in capsys.readouterr().err
