"""One long prompt on one model file: TTFT, the answer's start and the memory of every server process.

    .venv/bin/python benchmarks/long_prompt.py --model FILE.gguf [--tokens 16000] \\
        [--sluice-flags ''] [--llama-server /work/peers/build/bin/llama-server] \\
        [--llama-flags '-t 2 -c 17000'] [--max-tokens 16] [--out result.json]

For each server in turn (never two at once): start it on FILE in its own
process group, wait for /health, send one streamed, greedy chat completion
whose user message is `--tokens` tokens of tests/data/quality_text.txt
repeated (counted by the model's own tokenizer, before the chat template:
sluice's config-and-tokenizer folder of the GGUF, a few MB in its cache),
then stop it. Servers:
- sluice: `sluice serve --model FILE` with the README's defaults, plus
  `--sluice-flags` (e.g. `--max-model-len 17000` where the file's context
  is shorter than the prompt);
- llama-server (`--llama-server`): `-m FILE` with `--llama-flags`
  (default `-t 2 -c 17000`: two threads, one slot of 17,000 tokens).
Recorded per server: the time from start to /health; TTFT (request sent to
the first streamed content); the answer's text; the peak, over samples every
`--sample-s` from start to stop, of the summed RSS and PSS (smaps_rollup) of
every process of the server's group, the engine process included (PSS counts
a page mapped by several of them once); that peak while the prompt ran; and
the server's own lines about its memory (sluice's startup line, llama.cpp's
buffer sizes). A figure taken on a shared machine is marked by `--note`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _peer_servers import stop_group  # noqa: E402
from serve import free_port, log_tail, start_server  # noqa: E402

TEXT = ROOT / "tests" / "data" / "quality_text.txt"
# The lines of a server's log that say what it holds in memory.
MEMORY_LINES = re.compile(r"engine ready:|buffer size|KV self size|llama_kv_cache|n_ctx_slot")


@dataclass(slots=True)
class Result:
    server: str
    command: str
    prompt_tokens: int
    startup_s: float | None = None
    ttft_s: float | None = None
    total_s: float | None = None
    answer: str = ""
    peak_rss_mib: float = 0.0
    peak_pss_mib: float = 0.0
    prompt_peak_rss_mib: float = 0.0
    prompt_peak_pss_mib: float = 0.0
    num_processes: int = 0
    memory_lines: list[str] = field(default_factory=list)
    error: str | None = None


# ---- the prompt --------------------------------------------------------------------------------


def prompt_of(num_tokens: int, text: str, encode: Callable[[str], list[int]],
              decode: Callable[[list[int]], str]) -> tuple[str, int]:  # fmt: skip
    """`text` repeated, cut to `num_tokens` tokens; (prompt, its token count)."""
    text = text if text.endswith("\n") else text + "\n"  # copies apart, not run together
    count = max(len(encode(text)), 1)
    ids = encode(text * (num_tokens // count + 1))[:num_tokens]
    prompt = decode(ids)
    return prompt, len(encode(prompt))


def model_tokenizer(model: Path, cache_dir: Path | None):
    """sluice's tokenizer of `model`: a GGUF's config-and-tokenizer folder, or an HF folder."""
    from sluice.config import default_cache_dir
    from sluice.loader.gguf_convert import converted_folder
    from sluice.tokenizer import Tokenizer

    if model.is_dir():
        return Tokenizer.from_folder(model)
    cache = cache_dir or default_cache_dir()
    return Tokenizer.from_folder(converted_folder(model, cache, with_weights=False))


# ---- memory of a process group -------------------------------------------------------------


def group_pids(pgid: int) -> list[int]:
    """The processes whose process group is `pgid` (a server started in its own session)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # state, ppid, pgrp
            pids.append(int(entry.name))
    return pids


def rss_pss_bytes(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process from /proc/PID/smaps_rollup; (0, 0) if it is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0, 0
    values = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("Rss:", "Pss:"):
            values[parts[0]] = int(parts[1]) * 1024
    return values.get("Rss:", 0), values.get("Pss:", 0)


class GroupMemory:
    """Samples a process group's summed RSS and PSS every `interval_s` on a thread."""

    def __init__(self, pgid: int, interval_s: float):
        self.pgid, self.interval_s = pgid, interval_s
        self.peak = (0, 0)
        self.window_peak = (0, 0)  # since start_window; (0, 0) before it
        self._in_window = False
        self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GroupMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> tuple[int, int]:
        pids = group_pids(self.pgid)
        self.max_processes = max(self.max_processes, len(pids))
        sizes = [rss_pss_bytes(pid) for pid in pids]
        total = (sum(s[0] for s in sizes), sum(s[1] for s in sizes))
        self.peak = (max(self.peak[0], total[0]), max(self.peak[1], total[1]))
        if self._in_window:
            self.window_peak = (
                max(self.window_peak[0], total[0]),
                max(self.window_peak[1], total[1]),
            )
        return total

    def start_window(self) -> None:
        """From now on window_peak is the peak since this call."""
        self.window_peak = (0, 0)
        self._in_window = True

    def _run(self) -> None:
        while not self._stop.is_set():  # bounded by __exit__
            self.sample()
            self._stop.wait(self.interval_s)


# ---- one streamed request ------------------------------------------------------------------


def served_model(port: int) -> str:
    """The first model id of GET /v1/models (sluice checks the name; llama-server does not)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/v1/models")
    models = json.loads(connection.getresponse().read())
    connection.close()
    return models["data"][0]["id"]


def stream_chat(
    port: int, prompt: str, max_tokens: int, timeout_s: float
) -> tuple[float, float, str]:
    """(TTFT, total seconds, answer) of one greedy streamed chat completion."""
    body = json.dumps({
        "model": served_model(port), "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True,
    })  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    start_s = time.monotonic()
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:500]!r}")
    ttft_s, pieces = None, []
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[5:]).get("choices", []):
            text = (choice.get("delta") or {}).get("content") or ""
            if text and ttft_s is None:
                ttft_s = time.monotonic() - start_s
            pieces.append(text)
    connection.close()
    total_s = time.monotonic() - start_s
    if ttft_s is None:  # e.g. the server died mid-prompt: no TTFT to report
        raise RuntimeError(f"the stream ended after {total_s:.1f} s with no content")
    return ttft_s, total_s, "".join(pieces)


def wait_ready(port: int, process: subprocess.Popen, timeout_s: float) -> None:
    """Until /health answers 200; RuntimeError as soon as the server has exited."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:  # bounded by timeout_s
        if process.poll() is not None:
            raise RuntimeError("the server exited before it was ready")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    raise TimeoutError(f"/health did not answer 200 in {timeout_s:.0f} s")


# ---- one server ------------------------------------------------------------------------------


def measure(name: str, command: str, prompt: tuple[str, int], args: argparse.Namespace,
            log_path: Path) -> Result:  # fmt: skip
    result = Result(name, command, prompt[1])
    port = free_port()
    start_s = time.monotonic()
    process = start_server(command, port, log_path)
    try:
        with GroupMemory(process.pid, args.sample_s) as memory:
            try:
                wait_ready(port, process, args.startup_timeout)
                result.startup_s = time.monotonic() - start_s
                memory.start_window()
                result.ttft_s, result.total_s, result.answer = stream_chat(
                    port, prompt[0], args.max_tokens, args.request_timeout
                )
                memory.sample()
            except (TimeoutError, RuntimeError, OSError) as error:
                exited = process.poll()
                status = f" (exit status {exited})" if exited is not None else ""
                result.error = f"{type(error).__name__}: {error}{status}\n{log_tail(log_path, 30)}"
            result.prompt_peak_rss_mib = memory.window_peak[0] / 2**20
            result.prompt_peak_pss_mib = memory.window_peak[1] / 2**20
        result.peak_rss_mib, result.peak_pss_mib = (b / 2**20 for b in memory.peak)
        result.num_processes = memory.max_processes
    finally:
        stop_group(process)
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    result.memory_lines = [line for line in text.splitlines() if MEMORY_LINES.search(line)][:12]
    return result


def server_commands(args: argparse.Namespace) -> list[tuple[str, str]]:
    model = shlex.quote(str(args.model))
    sluice = f"{shlex.quote(str(args.sluice_bin))} serve --model {model} "
    commands = [("sluice", f"{sluice}--host 127.0.0.1 --port {{port}} {args.sluice_flags}".strip())]
    if args.llama_server is not None:
        llama = f"{shlex.quote(str(args.llama_server))} -m {model} --host 127.0.0.1 --port {{port}}"
        commands.append(("llama-server", f"{llama} {args.llama_flags}".strip()))
    return commands


def summary(result: Result, note: str) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    lines = [
        f"{result.server}{f' ({note})' if note else ''}: {result.prompt_tokens} prompt tokens, "
        f"startup {seconds(result.startup_s)}, TTFT {seconds(result.ttft_s)}, "
        f"total {seconds(result.total_s)}",
        f"  peak memory of its {result.num_processes} processes: RSS {result.peak_rss_mib:.0f} MiB"
        f", PSS {result.peak_pss_mib:.0f} MiB (during the prompt: RSS "
        f"{result.prompt_peak_rss_mib:.0f}, PSS {result.prompt_peak_pss_mib:.0f} MiB)",
        f"  answer: {result.answer[:200]!r}",
        *(f"  log: {line.strip()[:400]}" for line in result.memory_lines),
    ]
    if result.error:
        lines.append(f"  ERROR: {result.error}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a GGUF file (or an HF folder)")
    parser.add_argument("--tokens", type=int, default=16000, help="prompt length in tokens")
    parser.add_argument("--max-tokens", type=int, default=16, help="answer length")
    parser.add_argument("--text", type=Path, default=TEXT, help="the text repeated")
    parser.add_argument("--sluice-bin", type=Path, default=ROOT / ".venv" / "bin" / "sluice")
    parser.add_argument("--sluice-flags", default="", help="more `sluice serve` flags")
    parser.add_argument("--cache-dir", type=Path, default=None, help="sluice's model cache")
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary")
    parser.add_argument("--llama-flags", default="-t 2 -c 17000")
    parser.add_argument("--no-sluice", action="store_true", help="llama-server only")
    parser.add_argument("--sample-s", type=float, default=0.5, help="memory sampling period")
    parser.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=3600.0, help="seconds")
    parser.add_argument("--note", default="", help="e.g. 'under load': printed with each figure")
    parser.add_argument("--log-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default: LOG_DIR/...json)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.model.exists():
        print(f"no model at {args.model}", file=sys.stderr)
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="sluice-long-prompt-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = model_tokenizer(args.model, args.cache_dir)
    prompt = prompt_of(args.tokens, args.text.read_text(), tokenizer.encode, tokenizer.decode)
    print(f"prompt: {prompt[1]} tokens of {args.text.name}; logs in {log_dir}", flush=True)
    results = []
    for name, command in server_commands(args):
        if name == "sluice" and args.no_sluice:
            continue
        result = measure(name, command, prompt, args, log_dir / f"{name}.log")
        print(summary(result, args.note), flush=True)
        results.append(result)
    out = args.out or log_dir / "long_prompt.json"
    report = {"model": str(args.model), "note": args.note, "results": [asdict(r) for r in results]}
    out.write_text(json.dumps(report, indent=2))
    print(f"results: {out}")
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
