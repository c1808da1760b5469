"""Claude Code, Anthropic's agent, completes a one-turn task against `sluice
serve` on the embedded model, over the Messages API (`claude -p`).

Claude Code (pinned, installed into .agents/ by `make agents`, which `make
test` runs) sends its whole agent prompt: a system prompt in blocks with
cache_control, its tools with input_schema, system turns among the messages,
`thinking: {"type": "adaptive"}`, `context_management`, `output_config` and
`max_tokens: 128000`, to `/v1/messages?beta=true` with `x-api-key`. Its
prompt is about 4,200 tokens of the embedded model's 8,192. The 128,000 asked
for are lowered, never refused: to what the context leaves (~4,000), and
here to `--max-tokens-limit` (128), which bounds the test's decoding.
The 135M model must end its reply itself: Claude Code asks a reply cut at
`max_tokens` to go on, three times, then fails ("exceeded the 128000 output
token maximum"), and at temperature 1 (Claude Code sends none) or greedy the
small model rambles on. So the agent is run as a user of a small local model
would run it, with `CLAUDE_CODE_EXTRA_BODY` (Claude Code's own setting, merged
into every request body) asking for greedy decoding and a stop at the first
"." or line break: one sentence, then `stop_sequence`. The server runs in
float32 so that greedy reply is the same on every machine. Nothing leaves 127.0.0.1: telemetry,
updates and error reports are off, HOME is a fresh folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from sluice.testing.server_process import sluice_serve

pytestmark = pytest.mark.slow

CLAUDE = Path(__file__).resolve().parent.parent / ".agents" / "node_modules" / ".bin" / "claude"
STARTUP_TIMEOUT_S = 300
# Prefill of the agent's prompt and a few hundred tokens on a busy 2-core CPU.
AGENT_TIMEOUT_S = 900
MAX_MODEL_LEN = 8192
MAX_TOKENS_LIMIT = 128
# Greedy output that does not depend on the machine: float32 without
# quantization (the default's bfloat16 and int8 activations are chosen by
# timing at load, and their numerics change with the batch: issue 28).
DETERMINISTIC = ("--dtype", "float32", "--quantization", "none")
# Claude Code's tool definitions alone overflow the embedded model's 8,192
# tokens once shown to it: its tools are left out, as a user of this model would.
NO_TOOLS = ("--tool-call-parser", "none")
ACCESS_LINE = re.compile(r'"POST /v1/messages" 200 prompt_tokens=(\d+) completion_tokens=(\d+)')


@pytest.fixture(scope="module")
def served(embedded_model_config, tmp_path_factory):
    """`sluice serve` on the embedded model: its URL and its log file."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    args = [
        "--cache-dir", str(embedded_model_config.cache_dir),
        "--max-model-len", str(MAX_MODEL_LEN), "--max-tokens-limit", str(MAX_TOKENS_LIMIT),
        "--kv-cache-memory", "512MiB", *DETERMINISTIC, *NO_TOOLS,
    ]  # fmt: skip
    with sluice_serve(*args, log_path=log_path, startup_timeout_s=STARTUP_TIMEOUT_S) as url:
        yield url, log_path


def agent_environment(url: str, home: Path) -> dict[str, str]:
    keep = {name: os.environ[name] for name in ("PATH", "LANG", "TERM") if name in os.environ}
    return keep | {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "any",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "API_TIMEOUT_MS": str(AGENT_TIMEOUT_S * 1000),
        "CLAUDE_CODE_EXTRA_BODY": json.dumps({"temperature": 0, "stop_sequences": [".", "\n"]}),
    }


def test_claude_code_completes_a_one_turn_task(served, tmp_path):
    assert CLAUDE.exists(), f"{CLAUDE} is missing: run `make agents` (make test does)"
    url, log_path = served
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(), home.mkdir()
    done = subprocess.run(
        [str(CLAUDE), "-p", "Reply with the word hello"],
        cwd=work, env=agent_environment(url, home), capture_output=True, text=True,
        timeout=AGENT_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, f"claude failed: {done.stderr[-2000:]}\n{done.stdout[-2000:]}"
    assert done.stdout.strip(), "claude printed no answer"
    # The server's access log: the agent's request, whole, with its prompt size.
    lines = ACCESS_LINE.findall(log_path.read_text())
    assert lines, "the agent's requests are in the access log, answered 200"
    for num_prompt_tokens, num_completion_tokens in (map(int, line) for line in lines):
        print(f"claude code: {num_prompt_tokens} prompt tokens, {num_completion_tokens} generated")
        assert 3000 < num_prompt_tokens < MAX_MODEL_LEN
        assert 0 < num_completion_tokens <= MAX_TOKENS_LIMIT
