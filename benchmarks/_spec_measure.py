"""Measuring one server run for speculative.py: start, wait, warm up, the tasks, the levels, stop.

A run starts one variant (a server with speculation off or with one kind of
it), waits until it answers, warms it up (`--warmup` short streams, then one
prompt of random words as long as the code task's), then each task
once as a single greedy stream read to its end (its text kept, to compare
with speculation off), and, for sluice's variants, every level of
closed-loop streams (_load.py's, as peers.py runs them). Drafted and
accepted tokens come from sluice's /metrics counters read before and after,
or from the `timings` object of llama-server's last chunk. The server's
whole process group is stopped whatever happened; a failure lands in the
run's `error` with the tail of its log.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
from _load import LoadSpec, RequestRecord, _post, _StreamReader, chunk_text, request_body, run_level
from _peer_measure import num_requests_for
from _peer_report import LevelResult, level_result
from _peer_servers import say, stop_group
from _spec_report import SpecLevel, TaskRun, decode_tok_s, spec_counters
from serve import free_port, log_tail, resolve_model, start_server, wait_ready

WARMUP_MAX_TOKENS = 16


@dataclass(slots=True, frozen=True)
class Variant:
    """One server command with speculation off or one kind of it."""

    name: str  # "sluice off", "sluice on", "llama.cpp off", "llama.cpp ngram-simple"
    family: str  # "sluice" or "llama.cpp": a ratio's base is the family's variant that is off
    is_speculative: bool
    command: str  # shell-like, "{port}" filled in at start


@dataclass(slots=True)
class VariantRun:
    """One start of one variant: every task once, then (sluice) every level."""

    variant: str
    repeat: int  # 0-based
    tasks: list[TaskRun] = field(default_factory=list)
    levels: list[SpecLevel] = field(default_factory=list)
    error: str | None = None  # why the run stopped early, if it did


class _TextReader(_StreamReader):
    """_load.py's reader that also keeps the text and llama-server's `timings`."""

    def __init__(self, record: RequestRecord, api: str, start_s: float) -> None:
        super().__init__(record, api, start_s)
        self.text_parts: list[str] = []
        self.timings: dict = {}

    def on_chunk(self, chunk: dict, now_s: float) -> None:
        super().on_chunk(chunk, now_s)
        self.text_parts.append(chunk_text(chunk, self.api))
        self.timings = chunk.get("timings") or self.timings


async def _read_metrics(session: aiohttp.ClientSession, base_url: str) -> tuple[int, int]:
    async with session.get(base_url + "/metrics") as response:
        response.raise_for_status()
        return spec_counters(await response.text())


async def _stream_task(
    session: aiohttp.ClientSession, spec: LoadSpec, variant: Variant, task: str, prompt: str
) -> TaskRun:
    """One greedy stream of `prompt`; drafts from /metrics (sluice) or `timings` (llama)."""
    is_sluice = variant.family == "sluice"
    before = await _read_metrics(session, spec.base_url) if is_sluice else (0, 0)
    record = RequestRecord(prompt_index=0)
    reader = _TextReader(record, spec.api, time.perf_counter())
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    url = spec.base_url + "/v1/chat/completions"
    await _post(session, url, request_body(spec, prompt), timeout, spec, record, reader)
    reader.finish(time.perf_counter())
    if is_sluice:
        after = await _read_metrics(session, spec.base_url)
        drafted, accepted = after[0] - before[0], after[1] - before[1]
    elif variant.is_speculative:
        drafted = int(reader.timings.get("draft_n", 0))
        accepted = int(reader.timings.get("draft_n_accepted", 0))
    else:
        drafted = accepted = None
    return TaskRun(
        task=task,
        decode_tok_s=decode_tok_s(record),
        num_tokens=record.num_output_tokens,
        num_drafted=drafted,
        num_accepted=accepted,
        text="".join(reader.text_parts),
        error=record.error,
    )


async def _measure_levels(spec: LoadSpec, run: VariantRun, args: argparse.Namespace) -> None:
    """Closed-loop streams at every level, with the drafts sluice counted meanwhile."""
    connector = aiohttp.TCPConnector(limit=max(args.levels) + 1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for concurrency in args.levels:
            before = await _read_metrics(session, spec.base_url)
            num_requests = num_requests_for(concurrency, args)
            level_run = await run_level(session, spec, concurrency, num_requests)
            after = await _read_metrics(session, spec.base_url)
            result: LevelResult = level_result(concurrency, level_run)
            run.levels.append(SpecLevel(result, after[0] - before[0], after[1] - before[1]))
            say(f"  C={concurrency}: {result.output_tokens_per_s or 0:.1f} tok/s, "
                f"{result.num_errors}/{num_requests} errors")  # fmt: skip


async def measure_running(
    run: VariantRun,
    variant: Variant,
    base_url: str,
    process,
    args: argparse.Namespace,
    prompts: dict[str, str],
    warmup_prompt: str,
) -> None:
    """Fill `run` from a started server: wait, warm up, the tasks, the levels (sluice)."""
    # A connection of its own per request: llama-server closes each after its stream.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        # 1. Wait until it answers, and learn the name it serves the model under.
        await wait_ready(session, base_url, args.startup_timeout, process)
        spec = LoadSpec(
            base_url=base_url,
            model=await resolve_model(session, base_url, None),
            api="chat",
            max_tokens=args.max_tokens,
            ignore_eos=args.ignore_eos,
            continuous_usage=variant.family == "sluice",  # exact tokens per chunk
            request_timeout_s=args.request_timeout,
        )
        # 2. Warm up: short streams, then one long prompt of other text.
        if args.warmup:
            warm_levels = replace(spec, max_tokens=32, ignore_eos=True)
            await run_level(session, warm_levels, args.warmup, args.warmup)
        warm_spec = replace(spec, max_tokens=WARMUP_MAX_TOKENS)
        await _stream_task(session, warm_spec, variant, "warm-up", warmup_prompt)
        # 3. Each task once, a single stream on the idle server.
        for task, prompt in prompts.items():
            task_run = await _stream_task(session, spec, variant, task, prompt)
            run.tasks.append(task_run)
            say(f"  {task}: {task_run.decode_tok_s or 0:.1f} tok/s, {task_run.num_tokens} "
                f"tokens, drafted {task_run.num_drafted}, accepted {task_run.num_accepted}"
                + (f", {task_run.error}" if task_run.error else ""))  # fmt: skip
    # 4. Closed-loop streams at every level (sluice's variants only).
    if variant.family == "sluice" and args.levels:
        level_spec = replace(spec, max_tokens=args.level_max_tokens, ignore_eos=True)
        await _measure_levels(level_spec, run, args)


def measure(
    variant: Variant,
    repeat: int,
    args: argparse.Namespace,
    prompts: dict[str, str],
    warmup_prompt: str,
    log_dir: Path,
) -> VariantRun:
    """Start, measure and stop one variant; a failure lands in .error with its log's tail."""
    run = VariantRun(variant=variant.name, repeat=repeat)
    port = free_port()
    log_path = log_dir / f"{variant.name.replace(' ', '_')}-{repeat}.log"
    process = start_server(variant.command, port, log_path)
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(measure_running(run, variant, url, process, args, prompts, warmup_prompt))
    except (TimeoutError, RuntimeError, aiohttp.ClientError, KeyError) as error:
        run.error = f"{type(error).__name__}: {error}"
        print(f"{variant.name} failed: {run.error}\n{log_tail(log_path)}", file=sys.stderr)
    finally:
        stop_group(process)
        say(f"  stopped {variant.name}")
    return run
