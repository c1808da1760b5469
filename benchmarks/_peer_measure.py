"""Measuring one server run for peers.py: start, wait, warm up, measure, stop.

One run fills one `ServerRun`: it waits for the server to answer, warms it
up (short streams, then one long prompt of other text), measures each long
prompt alone on the idle server, shortest first, then every level's
closed-loop streams, and stops the server's whole process group whatever
happened. A failure lands in the run's `error` with the tail of its log.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp
import psutil
from _load import LoadSpec, RequestRecord, run_level, send_request
from _peer_prompts import LongPrompts
from _peer_report import ServerRun, format_ms, format_number, level_result
from _peer_servers import Server, say, stop_group
from serve import free_port, log_tail, resolve_model, start_server, wait_ready

LONG_PROMPT_MAX_TOKENS = 8  # a long prompt measures TTFT; a few tokens make sure text arrives


def group_rss_mib(pgid: int) -> float | None:
    """The resident memory of every process in group `pgid` (the server and
    the processes it started), in MiB; None where none could be read."""
    total, found = 0, False
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid:
                total += process.memory_info().rss
                found = True
        except (OSError, psutil.Error):
            continue
    return total / 2**20 if found else None


def num_requests_for(concurrency: int, args: argparse.Namespace) -> int:
    return max(concurrency * args.requests_per_stream, args.min_requests)


class _Progress:
    """Prints a level's done requests at most every `every_s` seconds."""

    def __init__(self, label: str, num_requests: int, every_s: float = 15.0) -> None:
        self.label, self.num_requests, self.every_s = label, num_requests, every_s
        self.num_done, self.num_tokens = 0, 0
        self.start_s = self.last_s = time.monotonic()

    def __call__(self, record: RequestRecord) -> None:
        self.num_done += 1
        self.num_tokens += record.num_output_tokens
        now_s = time.monotonic()
        if now_s - self.last_s >= self.every_s and self.num_done < self.num_requests:
            self.last_s = now_s
            say(
                f"  {self.label}: {self.num_done}/{self.num_requests} requests, "
                f"{self.num_tokens / (now_s - self.start_s):.1f} tok/s so far"
            )


async def _long_prompt_ttft(
    session: aiohttp.ClientSession, spec: LoadSpec, prompt: str
) -> tuple[float | None, str]:
    record = await send_request(session, spec, 0, prompt=prompt)
    return record.ttft_s, record.error or ""


async def _warm_up(
    session: aiohttp.ClientSession, spec: LoadSpec, args: argparse.Namespace, prompts: LongPrompts
) -> None:
    """Short streams, then one long prompt whose text no measured prompt shares."""
    say(f"  warm-up: {args.warmup} streams" + (", then a long prompt" if prompts.warmup else ""))
    warm_spec = LoadSpec(**{**asdict(spec), "max_tokens": min(32, args.max_tokens)})
    await run_level(session, warm_spec, min(args.warmup, max(args.levels)), args.warmup)
    if prompts.warmup:
        long_spec = LoadSpec(**{**asdict(spec), "max_tokens": LONG_PROMPT_MAX_TOKENS})
        await _long_prompt_ttft(session, long_spec, prompts.warmup)


async def _measure_long_prompts(
    session: aiohttp.ClientSession, spec: LoadSpec, run: ServerRun, prompts: LongPrompts
) -> None:
    """Each length's one fresh prompt alone on the idle server, shortest first."""
    long_spec = LoadSpec(**{**asdict(spec), "max_tokens": LONG_PROMPT_MAX_TOKENS})
    for num_tokens, prompt in sorted(prompts.measured.items()):
        ttft_s, error = await _long_prompt_ttft(session, long_spec, prompt)
        run.long_prompt_ttft_s[num_tokens] = ttft_s
        say(f"  {num_tokens}-token prompt: TTFT {format_ms(ttft_s)} ms {error}".rstrip())


async def _measure_levels(
    session: aiohttp.ClientSession, spec: LoadSpec, run: ServerRun, args: argparse.Namespace
) -> None:
    """Closed-loop streams at every level."""
    run.levels = []
    for concurrency in args.levels:
        num_requests = num_requests_for(concurrency, args)
        progress = _Progress(f"C={concurrency}", num_requests)
        level_run = await run_level(session, spec, concurrency, num_requests, progress)
        result = level_result(concurrency, level_run)
        run.levels.append(result)
        say(
            f"  C={concurrency}: {format_number(result.output_tokens_per_s)} tok/s, "
            f"TTFT p50 {format_ms(result.ttft_p50_s)} ms, ITL p50 {format_ms(result.itl_p50_s)} ms, "
            f"{result.num_errors}/{num_requests} errors, {level_run.wall_s:.1f} s"
        )


async def measure_running(
    run: ServerRun,
    base_url: str,
    process: subprocess.Popen,
    args: argparse.Namespace,
    prompts: LongPrompts,
    started_s: float,
) -> None:
    """Fill `run` from a server started at `started_s` (time.monotonic()): wait,
    warm up, the long prompts, every level."""
    connector = aiohttp.TCPConnector(limit=max(args.levels) + 1)
    async with aiohttp.ClientSession(connector=connector) as session:
        # 1. Wait until it answers, and learn the name it serves the model under.
        await wait_ready(session, base_url, args.startup_timeout, process)
        run.startup_s = time.monotonic() - started_s
        run.model = await resolve_model(session, base_url, None)
        spec = LoadSpec(
            base_url=base_url,
            model=run.model,
            api="chat",
            max_tokens=args.max_tokens,
            ignore_eos=True,
            continuous_usage=False,
            request_timeout_s=args.request_timeout,
        )
        # 2. Warm up: short streams, and one long prompt of other text.
        if args.warmup:
            await _warm_up(session, spec, args, prompts)
        # 3. Each length's long prompt alone on the idle server.
        await _measure_long_prompts(session, spec, run, prompts)
        # 4. Closed-loop streams at every level.
        await _measure_levels(session, spec, run, args)
        run.rss_mib = group_rss_mib(process.pid)


def measure(
    server: Server, repeat: int, args: argparse.Namespace, prompts: LongPrompts, log_dir: Path
) -> ServerRun:
    """Start, measure and stop one server; a failure lands in .error with its log's tail."""
    run = ServerRun(server=server.name, repeat=repeat)
    port = free_port()
    log_path = log_dir / f"{server.name.replace(' ', '_').replace('/', '_')}-{repeat}.log"
    started_s = time.monotonic()
    process = start_server(server.command, port, log_path)
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(measure_running(run, url, process, args, prompts, started_s))
    except (TimeoutError, RuntimeError, aiohttp.ClientError, KeyError) as error:
        run.error = f"{type(error).__name__}: {error}"
        print(f"{server.name} failed: {run.error}\n{log_tail(log_path)}", file=sys.stderr)
    finally:
        stop_group(process)
        say(f"  stopped {server.name}")
    return run
