"""Record a real agent's session against a server: its request bodies, in order, by turn.

    .venv/bin/python benchmarks/agent_record.py --agent codex|claude-code \\
        --url http://127.0.0.1:8000 --out benchmarks/data/agent_sessions/codex.jsonl.gz

The agent (Codex CLI or Claude Code, as `make agents` installs them into
.agents/) runs in a fresh scratch git repository holding a small Python
module, and is given `PROMPTS` one at a time, each in the same session
(`codex exec resume --last`, `claude -p --resume ID`): ten turns. It talks to
a recording proxy (_agent_proxy.py) in front of `--url`, which keeps every
request as sent, with its turn. The server should be `sluice serve` on the
embedded model with the flags a user of a 135M model needs for an agent to
finish a turn (see docs/BENCHMARKS.md, "Agent sessions"):

    sluice serve --tool-call-parser none --max-tokens-limit 128 \\
        --override-generation-config '{"temperature": 0, "stop_strings": ["."]}'

Output: a recording (_agent_session.py) that benchmarks/agent_replay.py replays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from _agent_proxy import RecordingProxy
from _agent_session import Session, write_recording

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / ".agents" / "node_modules"
DIALECTS = {"codex": "responses", "claude-code": "messages"}
TURN_TIMEOUT_S = 1800
PROMPTS = [
    "Read calc.py and tell me in one sentence what it does.",
    "Add a function subtract(a, b) to calc.py that returns a minus b.",
    "Write a pytest test for add in a new file test_calc.py.",
    "Rename the function mul to multiply everywhere.",
    "Add a docstring to every function in calc.py.",
    "Make divide raise ValueError when b is zero.",
    "Add type hints to all functions in calc.py.",
    "Write a short README.md that explains how to run the tests.",
    "Add a function power(a, b) to calc.py with a test.",
    "Summarize every change we made in this session as a bullet list.",
]
CALC_PY = """def add(a, b):
    return a + b


def mul(a, b):
    return a * b


def divide(a, b):
    return a / b
"""


def scratch_repository(folder: Path) -> Path:
    work = folder / "work"
    work.mkdir(parents=True)
    (work / "calc.py").write_text(CALC_PY)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "calc.py"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "calc"], cwd=work, check=True)
    return work


def agent_version(agent: str) -> str:
    package = {"codex": "@openai/codex", "claude-code": "@anthropic-ai/claude-code"}[agent]
    manifest = AGENTS / package / "package.json"
    return json.loads(manifest.read_text())["version"]


def served_model(url: str) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=30) as answer:
        return json.loads(answer.read())["data"][0]["id"]


def codex_command(turn: int, prompt: str) -> list[str]:
    codex = str(AGENTS / ".bin" / "codex")
    if turn == 1:
        return [codex, "exec", "--skip-git-repo-check", prompt]
    return [codex, "exec", "resume", "--last", "--skip-git-repo-check", prompt]


def codex_environment(folder: Path, proxy_url: str, model: str) -> dict[str, str]:
    home = folder / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "sluice"\n'
        "check_for_update_on_startup = false\n"
        "[model_providers.sluice]\n"
        f'name = "sluice"\nbase_url = "{proxy_url}/v1"\nenv_key = "SLUICE_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    return os.environ | {"CODEX_HOME": str(home), "SLUICE_API_KEY": "unused", "NO_COLOR": "1"}


def claude_command(turn: int, prompt: str, session_id: str) -> list[str]:
    claude = str(AGENTS / ".bin" / "claude")
    if turn == 1:
        return [claude, "-p", "--session-id", session_id, prompt]
    return [claude, "-p", "--resume", session_id, prompt]


def claude_environment(folder: Path, proxy_url: str) -> dict[str, str]:
    """As tests/test_e2e_claude_code.py runs it: nothing leaves 127.0.0.1."""
    home = folder / "claude-home"
    home.mkdir(exist_ok=True)
    keep = {name: os.environ[name] for name in ("PATH", "LANG", "TERM") if name in os.environ}
    return keep | {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": proxy_url,
        "ANTHROPIC_API_KEY": "any",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "API_TIMEOUT_MS": str(TURN_TIMEOUT_S * 1000),
        "CLAUDE_CODE_EXTRA_BODY": json.dumps({"temperature": 0, "stop_sequences": [".", "\n"]}),
    }


async def run_turns(args: argparse.Namespace, proxy: RecordingProxy, proxy_url: str) -> None:
    folder = args.scratch
    work = scratch_repository(folder)
    session_id = str(uuid.uuid4())
    model = served_model(args.url)
    for turn, prompt in enumerate(PROMPTS[: args.turns], start=1):
        proxy.turn = turn
        if args.agent == "codex":
            command = codex_command(turn, prompt)
            env = codex_environment(folder, proxy_url, model)
        else:
            command = claude_command(turn, prompt, session_id)
            env = claude_environment(folder, proxy_url)
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *command, cwd=work, env=env, stdin=subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), TURN_TIMEOUT_S)
        seconds = time.monotonic() - started
        sent = sum(1 for request in proxy.requests if request.turn == turn)
        print(
            f"turn {turn}: exit {process.returncode}, {sent} requests, {seconds:.0f} s", flush=True
        )
        if process.returncode != 0:
            print(out.decode()[-2000:], err.decode()[-2000:], file=sys.stderr)
            raise SystemExit(f"the agent failed on turn {turn}")


async def record(args: argparse.Namespace) -> None:
    proxy = RecordingProxy(args.url)
    proxy_url = await proxy.start(args.proxy_port)
    try:
        await run_turns(args, proxy, proxy_url)
    finally:
        await proxy.stop()
    session = Session(
        agent=args.agent, agent_version=agent_version(args.agent),
        dialect=DIALECTS[args.agent], model=served_model(args.url),
        server_command=args.server_command, prompts=PROMPTS[: args.turns],
        recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )  # fmt: skip
    write_recording(args.out, session, proxy.requests)
    print(f"{len(proxy.requests)} requests written to {args.out}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", choices=sorted(DIALECTS), required=True)
    parser.add_argument("--url", required=True, help="the server the proxy forwards to")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--turns", type=int, default=len(PROMPTS))
    parser.add_argument("--proxy-port", type=int, default=0, help="0: a free port")
    parser.add_argument("--scratch", type=Path, required=True, help="an empty folder to work in")
    parser.add_argument("--server-command", default="", help="noted in the recording's header")
    args = parser.parse_args(argv)
    if args.proxy_port == 0:
        sys.path.insert(0, str(ROOT))
        from sluice.testing.server_process import free_port

        args.proxy_port = free_port()
    return args


if __name__ == "__main__":
    asyncio.run(record(parse_args()))
