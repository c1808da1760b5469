"""Soak: a steady request mix for N minutes, watching the server's memory and file descriptors.

    .venv/bin/python benchmarks/soak.py --command '.venv/bin/sluice serve --port {port}'
    .venv/bin/python benchmarks/soak.py --base-url http://127.0.0.1:8000 --pid 12345
    [--minutes 10] [--concurrency 8] [--sample-s 5] [--warmup-fraction 0.2] [--max-tokens 16]

`--command` starts the server (its own process group, `{port}` filled in,
logging to `--log`) and stops it with SIGTERM at the end; `--base-url` + `--pid` watch one already
running. Each of `--concurrency` workers loops over the mix: chat and
completions, streamed and not, n=2, logprobs, stop strings, and a stream the
client drops after its first event (the abort path). Every `--sample-s`
seconds it prints the server's RSS and open file descriptors (and those of
its child processes, the engine, summed in "tree"), requests done and
failed. At the end, the samples after warm-up are compared: a later median
above the first post-warm-up median by more than 10% + 16 MiB (RSS) or 16
(fds) is flagged as GROWTH, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import psutil

RSS_SLACK_BYTES = 16 << 20
FD_SLACK = 16


@dataclass(slots=True)
class Sample:
    elapsed_s: float
    rss_bytes: int
    num_fds: int
    tree_rss_bytes: int
    tree_num_fds: int
    num_done: int
    num_failed: int


@dataclass(slots=True)
class Counters:
    num_done: int = 0
    num_failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        self.num_failed += 1
        self.failures[why] = self.failures.get(why, 0) + 1


def request_mix(max_tokens: int) -> list[tuple[str, dict, str]]:
    """(path, body, how to read it): "full", "stream" or "drop" (leave after one event)."""
    chat = [{"role": "user", "content": "Tell me about rivers."}]
    return [
        ("/v1/chat/completions", {"messages": chat, "max_tokens": max_tokens, "stream": True,
                                  "stream_options": {"include_usage": True}}, "stream"),
        ("/v1/chat/completions", {"messages": chat, "max_tokens": max_tokens}, "full"),
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": max_tokens,
                             "stream": True, "logprobs": 2}, "stream"),
        ("/v1/completions", {"prompt": "The river", "max_tokens": max_tokens, "n": 2,
                             "stop": ["\n\n", "."]}, "full"),
        ("/v1/completions", {"prompt": "Count: one, two,", "max_tokens": 4 * max_tokens,
                             "stream": True}, "drop"),
    ]  # fmt: skip


async def one_request(session, base_url: str, path: str, body: dict, how: str, counters) -> None:
    try:
        async with session.post(base_url + path, json=body) as response:
            if response.status != 200:
                counters.fail(f"HTTP {response.status}")
                await response.read()
                return
            if how == "drop":
                await response.content.readuntil(b"\n\n")
                response.close()  # the client leaves mid-stream
            else:
                payload = await response.read()
                if how == "stream" and not payload.endswith(b"data: [DONE]\n\n"):
                    counters.fail("stream without [DONE]")
                    return
                if b'"error"' in payload[:20] or b'data: {"error"' in payload:
                    counters.fail("error in body")
                    return
        counters.num_done += 1
    except (TimeoutError, aiohttp.ClientError) as error:
        counters.fail(type(error).__name__)


async def worker(session, base_url: str, mix, stop_s: float, counters, rng) -> None:
    while time.monotonic() < stop_s:
        path, body, how = rng.choice(mix)
        await one_request(session, base_url, path, body, how, counters)


def sample(process: psutil.Process, start_s: float, counters: Counters) -> Sample:
    tree = [process, *process.children(recursive=True)]
    rss = [p.memory_info().rss for p in tree]
    fds = [p.num_fds() for p in tree]
    return Sample(time.monotonic() - start_s, rss[0], fds[0], sum(rss), sum(fds),
                  counters.num_done, counters.num_failed)  # fmt: skip


async def sampler(process, start_s: float, stop_s: float, every_s: float, counters, samples):
    print(f"{'t_s':>6} {'rss_MiB':>8} {'fds':>5} {'tree_MiB':>9} {'tree_fds':>8} "
          f"{'done':>6} {'failed':>6}", flush=True)  # fmt: skip
    while time.monotonic() < stop_s:
        s = sample(process, start_s, counters)
        samples.append(s)
        print(f"{s.elapsed_s:6.0f} {s.rss_bytes / 2**20:8.1f} {s.num_fds:5d} "
              f"{s.tree_rss_bytes / 2**20:9.1f} {s.tree_num_fds:8d} {s.num_done:6d} "
              f"{s.num_failed:6d}", flush=True)  # fmt: skip
        await asyncio.sleep(every_s)


def growth_report(samples: list[Sample], warmup_fraction: float) -> list[str]:
    """What grew after warm-up: first vs last third of the post-warm-up samples."""
    after = [s for s in samples if s.elapsed_s >= warmup_fraction * samples[-1].elapsed_s]
    if len(after) < 6:
        return ["too few samples after warm-up to judge growth"]
    third = len(after) // 3
    early, late = after[:third], after[-third:]
    problems = []
    for name, attr, slack, unit in (("RSS", "rss_bytes", RSS_SLACK_BYTES, 2**20),
                                    ("tree RSS", "tree_rss_bytes", RSS_SLACK_BYTES, 2**20),
                                    ("fds", "num_fds", FD_SLACK, 1),
                                    ("tree fds", "tree_num_fds", FD_SLACK, 1)):  # fmt: skip
        first = statistics.median(getattr(s, attr) for s in early)
        last = statistics.median(getattr(s, attr) for s in late)
        verdict = "GROWTH" if last > first * 1.1 + slack else "flat"
        line = f"{name:>9}: {first / unit:9.1f} -> {last / unit:9.1f}  {verdict}"
        print(line)
        if verdict == "GROWTH":
            problems.append(line)
    return problems


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_ready(base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(base_url + "/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise SystemExit(f"{base_url} did not become healthy in {timeout_s:.0f} s")


async def soak(args: argparse.Namespace, base_url: str, pid: int) -> int:
    await wait_ready(base_url, 600)
    process = psutil.Process(pid)
    counters, samples = Counters(), []
    start_s = time.monotonic()
    stop_s = start_s + args.minutes * 60
    mix = request_mix(args.max_tokens)
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        workers = [
            worker(session, base_url, mix, stop_s, counters, random.Random(index))
            for index in range(args.concurrency)
        ]
        await asyncio.gather(
            sampler(process, start_s, stop_s, args.sample_s, counters, samples), *workers
        )
    samples.append(sample(process, start_s, counters))
    print(f"\n{counters.num_done} requests done, {counters.num_failed} failed {counters.failures}")
    problems = growth_report(samples, args.warmup_fraction)
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", help="server command with {port}")
    parser.add_argument("--base-url")
    parser.add_argument("--pid", type=int, help="the server's pid, with --base-url")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sample-s", type=float, default=5)
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--log", default="soak-server.log", help="the started server's log")
    args = parser.parse_args()
    if args.command is None and (args.base_url is None or args.pid is None):
        parser.error("give --command, or --base-url and --pid")
    if args.command is None:
        return asyncio.run(soak(args, args.base_url.rstrip("/"), args.pid))
    port = free_port()
    argv = shlex.split(args.command.replace("{port}", str(port)))
    print(f"server: {shlex.join(argv)}  (log: {args.log})", flush=True)
    with open(args.log, "wb") as log:
        server = subprocess.Popen(argv, start_new_session=True, stdout=log, stderr=log)
    try:
        return asyncio.run(soak(args, f"http://127.0.0.1:{port}", server.pid))
    finally:
        server.send_signal(signal.SIGTERM)  # the server drains and stops its engine
        try:
            print(f"server exit status {server.wait(60)}")
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
