"""Codex CLI, the real agent (`@openai/codex`, installed by `make agents`),
completes a one-turn task against `sluice serve` on the embedded model over
the Responses API, its only wire API.

Codex sends its whole agent prompt (about 4,500 tokens of instructions,
environment and skills, plus a dozen tool definitions, some of kinds a local
server cannot run) and reads the streamed events until `response.completed`;
a `response.incomplete` or a 4xx stops it with an error. The server runs
in float32 with sampling defaults for agents (below), so the reply is the
same on every machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx2
import pytest

from sluice.testing.server_process import sluice_serve

pytestmark = pytest.mark.slow

CODEX = Path(__file__).resolve().parent.parent / ".agents" / "node_modules" / ".bin" / "codex"
# Codex sends no sampling fields: at temperature 1 (or greedy) the 135M
# model rambles on to the end of its context, and Codex treats a reply cut
# there (response.incomplete) as an error. So the server sets what a user of
# a small local model would: greedy, and a stop at the first ".".
DEFAULTS = '{"temperature": 0, "stop_strings": ["."]}'
# Greedy output that does not depend on the machine: float32 without
# quantization (the default's bfloat16 and int8 activations are chosen by
# timing at load, and their numerics change with the batch: issue 28).
DETERMINISTIC = ("--dtype", "float32", "--quantization", "none")
# Codex's tool definitions take ~6,000 of the embedded model's 8,192 tokens
# once shown to it (12,400 with its prompt): its tools are left out, as a
# user of this model would.
NO_TOOLS = ("--tool-call-parser", "none")
# Prefill of the agent's prompt and a reply of up to the rest of the context.
TASK_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def server_url(embedded_model_config, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    cache_dir = str(embedded_model_config.cache_dir)
    with sluice_serve("--cache-dir", cache_dir, "--override-generation-config", DEFAULTS,
                      *DETERMINISTIC, *NO_TOOLS, log_path=log_path) as url:  # fmt: skip
        yield url


def metric(url: str, name: str) -> float:
    text = httpx2.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def codex_home(tmp_path: Path, url: str) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "SmolLM2-135M-Instruct"\nmodel_provider = "sluice"\n'
        "check_for_update_on_startup = false\n"
        "[model_providers.sluice]\n"
        f'name = "sluice"\nbase_url = "{url}/v1"\nenv_key = "SLUICE_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    return home


def test_codex_exec_completes_a_one_turn_task(server_url, tmp_path):
    assert CODEX.exists(), "make agents installs Codex CLI into .agents/"
    assert shutil.which("node"), "Codex CLI's launcher needs node"
    prompt_tokens_before = metric(server_url, "vllm:prompt_tokens_total")
    env = os.environ | {"CODEX_HOME": str(codex_home(tmp_path, server_url)),
                        "SLUICE_API_KEY": "unused", "NO_COLOR": "1"}  # fmt: skip
    done = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "Reply with the word hello"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TASK_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "ERROR" not in output, output[-3000:]
    assert done.stdout.strip(), "the agent printed the model's reply"
    # The whole agent prompt reached the model (not a body emptied on the way).
    assert metric(server_url, "vllm:prompt_tokens_total") - prompt_tokens_before > 3000
