"""The chat page's time to first token under a batch job, without and with priorities.

    .venv/bin/python benchmarks/priority_ttft.py \\
        [--command '.venv/bin/sluice serve --port {port}'] \\
        [--batch-streams 64] [--batch-max-tokens 512] [--chats 16] \\
        [--chat-max-tokens 32] [--chat-priority -10] [--out results.json]
    .venv/bin/python benchmarks/priority_ttft.py --fcfs-url URL --priority-url URL ...

Two runs, one after the other, side by side in one report: the same server
command started with `--scheduling-policy fcfs` and then with
`--scheduling-policy priority` (or two servers already running). In each:
`batch_streams` streams of `batch_max_tokens` tokens (ignore_eos, priority 0,
sent without the field under fcfs) start at once and keep the batch full
(each one that ends is sent again); once every batch stream has its first
token, `chats` chat requests go one after another, streamed, each timed from
send to its first content chunk (TTFT), with `"priority": chat_priority`
under the priority policy only. The batch's tokens/s over the chat window is
reported too: what the chat's speed costs the batch.

The figure needs a quiet machine: anything else on the CPU moves both
columns. Bounds: every request has a total timeout; the server must answer
within `--startup-timeout`; each run stops after its chats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from _load import PROMPTS, percentile
from serve import free_port, log_tail, resolve_model, start_server, stop_server, wait_ready

POLICIES = ("fcfs", "priority")
BATCH_PROMPT = "Write a long essay about rivers, their sources, their floods and their deltas."


@dataclass(slots=True)
class RunResult:
    policy: str
    ttft_s: list[float]
    num_chat_errors: int
    batch_tokens_per_s: float

    def row(self) -> dict[str, float | int | str | None]:
        return {
            "policy": self.policy,
            "chats": len(self.ttft_s),
            "ttft_p50_ms": _ms(percentile(self.ttft_s, 50)),
            "ttft_p90_ms": _ms(percentile(self.ttft_s, 90)),
            "ttft_max_ms": _ms(max(self.ttft_s, default=None)),
            "chat_errors": self.num_chat_errors,
            "batch_tokens_per_s": round(self.batch_tokens_per_s, 1),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def batch_body(model: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": BATCH_PROMPT, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip


def chat_body(model: str, index: int, max_tokens: int, priority: int | None) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}  # fmt: skip
    if priority is not None:  # an fcfs server refuses the field
        body["priority"] = priority
    return body


class BatchLoad:
    """`num_streams` batch streams kept running until `stop`; counts their tokens."""

    def __init__(self, session, url: str, body: dict, num_streams: int, timeout_s: float):
        self._session, self._url, self._body = session, url, body
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.started = asyncio.Event()
        self._num_started = 0
        self._num_streams = num_streams
        self.num_tokens = 0
        self._is_stopping = False
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(num_streams)]

    async def _worker(self) -> None:
        is_first = True
        while not self._is_stopping:
            async with self._session.post(self._url, json=self._body, timeout=self._timeout) as r:
                if r.status != 200:
                    raise RuntimeError(f"a batch stream got {r.status}: {await r.text()}")
                num_counted = 0  # cumulative usage on every chunk: exact token counts
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    if is_first:
                        is_first = False
                        self._num_started += 1
                        if self._num_started == self._num_streams:
                            self.started.set()
                    usage = json.loads(line[6:]).get("usage") or {}
                    num_tokens = usage.get("completion_tokens", num_counted)
                    self.num_tokens += num_tokens - num_counted
                    num_counted = num_tokens

    async def stop(self) -> None:
        self._is_stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def chat_ttft(session, url: str, body: dict, timeout_s: float) -> float | None:
    """Seconds to the first content chunk; None if the request failed."""
    start_s = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.post(url, json=body, timeout=timeout) as response:
        if response.status != 200:
            return None
        ttft_s = None
        async for line in response.content:  # read to the end: the chat's whole turn
            if ttft_s is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    ttft_s = time.perf_counter() - start_s
        return ttft_s


async def measure(base_url: str, policy: str, args: argparse.Namespace) -> RunResult:
    connector = aiohttp.TCPConnector(limit=args.batch_streams + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_ready(session, base_url, args.startup_timeout, None)
        model = await resolve_model(session, base_url, args.model)
        batch = BatchLoad(session, base_url + "/v1/completions",
                          batch_body(model, args.batch_max_tokens), args.batch_streams,
                          args.request_timeout)  # fmt: skip
        try:
            await asyncio.wait_for(batch.started.wait(), args.request_timeout)
            tokens_before, window_start_s = batch.num_tokens, time.perf_counter()
            priority = args.chat_priority if policy == "priority" else None
            ttfts: list[float] = []
            errors = 0
            for index in range(args.chats):
                body = chat_body(model, index, args.chat_max_tokens, priority)
                ttft_s = await chat_ttft(session, base_url + "/v1/chat/completions", body,
                                         args.request_timeout)  # fmt: skip
                if ttft_s is None:
                    errors += 1
                else:
                    ttfts.append(ttft_s)
            window_s = time.perf_counter() - window_start_s
            batch_rate = (batch.num_tokens - tokens_before) / window_s
        finally:
            await batch.stop()
    return RunResult(policy, ttfts, errors, batch_rate)


def run_policy(policy: str, args: argparse.Namespace, log_dir: Path) -> RunResult:
    base_url = getattr(args, f"{policy}_url")
    if base_url is not None:
        return asyncio.run(measure(base_url, policy, args))
    port = free_port()
    command = f"{args.command} --scheduling-policy {policy}"
    log_path = log_dir / f"{policy}.log"
    process = start_server(command, port, log_path)
    try:
        return asyncio.run(measure(f"http://127.0.0.1:{port}", policy, args))
    except BaseException:
        print(log_tail(log_path), file=sys.stderr)
        raise
    finally:
        stop_server(process)


def format_table(results: list[RunResult]) -> str:
    rows = [result.row() for result in results]
    header = list(rows[0])
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    lines += [" | ".join("-" if row[name] is None else str(row[name]) for name in header)
              for row in rows]  # fmt: skip
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--command",
        default=".venv/bin/sluice serve --port {port}",
        help="the server command, {port} filled in; the policy flag is added",
    )
    parser.add_argument("--fcfs-url", help="a server already running with fcfs (no --command)")
    parser.add_argument("--priority-url", help="a server already running with priority")
    parser.add_argument("--model", help="model name (default: the server's first)")
    parser.add_argument("--batch-streams", type=int, default=64)
    parser.add_argument("--batch-max-tokens", type=int, default=512)
    parser.add_argument("--chats", type=int, default=16)
    parser.add_argument("--chat-max-tokens", type=int, default=32)
    parser.add_argument("--chat-priority", type=int, default=-10)
    parser.add_argument("--startup-timeout", type=float, default=600)
    parser.add_argument("--request-timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="priority-ttft-") as folder:
        results = [run_policy(policy, args, Path(folder)) for policy in POLICIES]
    print(format_table(results))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(r) | r.row() for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
