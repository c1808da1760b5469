"""The frontend's cost per streamed token: sluice against pre-built SSE bytes.

    .venv/bin/python benchmarks/streaming.py [--concurrency 1,64,512] \\
        [--max-tokens 256] [--duration-s 3] [--sample-every 16] [--clients 1] \\
        [--repeats 1] [--tokenizer auto|real|fake] [--json [PATH]]

Two servers, each in its own process, on 127.0.0.1 with uvicorn + uvloop +
httptools: sluice (`create_app` over a `FakeEngine` that steps on every loop
turn, one token per stream per step, parroting the prompt) and the reference
of `_sse_reference.py` (pre-built events, one per token, no checks). The load
generator runs in its own process(es) (aiohttp on uvloop): at each
concurrency C, C workers send /v1/completions streams of `max_tokens` tokens
(the prompt as token ids, include_usage) back to back until `duration_s` has
passed, reading every byte. Tokens come from each stream's usage chunk (and
must equal max_tokens); chunks are the events that carry a choice.

Every `sample_every`-th stream asks for logprobs and continuous usage and is
checked in full: `sluice.testing.contract.check_stream` (wire, shape, I3-I5),
text == the full decode of the generated ids (I1), one logprob entry and one
usage count per token, max_tokens of them (I2). Any failure is counted and
the first messages are reported.

Figures per server and level: tokens/s, chunks/s, server CPU microseconds
per token (from /proc) and the client's CPU in cores (near 1.0 per client
process means the client is the bottleneck: add --clients). The FakeEngine
alone is timed first, so its share of the cost is known. Target (issue 4):
sluice's tokens/s at least 50% of the reference's at the largest C.
Bounds: a level stops starting streams after duration_s; every stream has a
total timeout; servers must be up within 120 s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import aiohttp
import uvloop
from _sse_reference import (
    MODEL,
    Workload,
    build_workload,
    check_sampled,
    count_plain,
    listening_socket,
    load_tokenizer,
    request_body,
    resolve_tokenizer_kind,
    serve_reference,
)

from sluice.config import ServerConfig, default_cache_dir
from sluice.engine.engine_request import generation_request
from sluice.engine.outputs import RequestDelta
from sluice.engine.sampling_params import SamplingParams
from sluice.testing import FakeEngine

TARGET_RATIO = 0.5
MAX_MODEL_LEN = 1 << 20
_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    concurrencies: tuple[int, ...] = (1, 64, 512)
    max_tokens: int = 256
    # Workers stop starting new streams after this; each finishes its current one.
    duration_s: float = 3.0
    sample_every: int = 16
    num_clients: int = 1
    repeats: int = 1
    # "real": the embedded tokenizer (converted if needed); "auto": it if cached.
    tokenizer: str = "auto"
    servers: tuple[str, ...] = ("sluice", "reference")
    # For tests: the reference sends one event twice (the checks must catch it).
    break_reference: bool = False
    request_timeout_s: float = 120.0
    cache_dir: Path = field(default_factory=default_cache_dir)


@dataclass(slots=True)
class LevelResult:
    server: str
    concurrency: int
    num_streams: int = 0
    num_tokens: int = 0
    num_chunks: int = 0
    num_checked: int = 0
    num_failures: int = 0
    failures: list[str] = field(default_factory=list)  # the first few messages
    wall_s: float = 0.0
    # CPU seconds of the client process(es) over the level.
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def chunks_per_s(self) -> float:
        return self.num_chunks / self.wall_s if self.wall_s else 0.0

    @property
    def server_cpu_us_per_token(self) -> float:
        return 1e6 * self.server_cpu_s / self.num_tokens if self.num_tokens else 0.0

    @property
    def client_cores(self) -> float:
        return self.client_cpu_s / self.wall_s if self.wall_s else 0.0

    def add(self, other: LevelResult) -> None:
        self.num_streams += other.num_streams
        self.num_tokens += other.num_tokens
        self.num_chunks += other.num_chunks
        self.num_checked += other.num_checked
        self.num_failures += other.num_failures
        self.failures = (self.failures + other.failures)[:3]
        self.wall_s = max(self.wall_s, other.wall_s)
        self.client_cpu_s += other.client_cpu_s


@dataclass(slots=True)
class BenchReport:
    config: BenchConfig
    tokenizer: str
    # Tokens/s the FakeEngine makes alone (no frontend) at the largest concurrency.
    engine_tokens_per_s: float
    levels: list[LevelResult]

    def median(self, server: str, concurrency: int) -> LevelResult | None:
        runs = [r for r in self.levels if (r.server, r.concurrency) == (server, concurrency)]
        runs.sort(key=lambda r: r.tokens_per_s)
        return runs[len(runs) // 2] if runs else None

    def ratio(self, concurrency: int) -> float | None:
        sluice = self.median("sluice", concurrency)
        reference = self.median("reference", concurrency)
        if sluice is None or reference is None or not reference.tokens_per_s:
            return None
        return sluice.tokens_per_s / reference.tokens_per_s

    @property
    def is_passed(self) -> bool:
        ratio = self.ratio(max(self.config.concurrencies))
        # A failed check on either server voids the comparison.
        is_clean = all(r.num_failures == 0 for r in self.levels)
        is_checked = any(r.num_checked for r in self.levels if r.server == "sluice")
        return ratio is not None and ratio >= TARGET_RATIO and is_clean and is_checked


# -- the servers ---------------------------------------------------------------------


def serve_sluice(port_out: Connection, tokenizer_kind: str, cache_dir: Path) -> None:
    """Process entry: sluice over a FakeEngine stepping on every loop turn,
    served as `sluice serve` serves (`launch.serve`: GC tuned, drain on SIGTERM)."""
    from sluice.server.http.app import create_app
    from sluice.server.http.launch import serve
    from sluice.server.served_models.served_model import ServedModel

    tokenizer = load_tokenizer(tokenizer_kind, cache_dir)
    engine = FakeEngine(step_interval_s=0.0, max_model_len=MAX_MODEL_LEN)
    config = ServerConfig(host="127.0.0.1", port=0)
    app = create_app(config, engine, ServedModel(MODEL, tokenizer, MAX_MODEL_LEN))
    sock = listening_socket()
    port_out.send(sock.getsockname()[1])
    serve(app, config, sockets=[sock])


@dataclass(frozen=True, slots=True)
class RunningServer:
    name: str
    url: str
    pid: int


@contextmanager
def running_server(name: str, target, args: tuple) -> Iterator[RunningServer]:
    """A server process; it listens (connections queue) once its port is known."""
    port_in, port_out = _SPAWN.Pipe(duplex=False)
    process = _SPAWN.Process(target=target, args=(port_out, *args), daemon=True)
    process.start()
    try:
        if not port_in.poll(120):
            raise RuntimeError(f"the {name} server did not start within 120 s")
        url = f"http://127.0.0.1:{port_in.recv()}/v1/completions"
        yield RunningServer(name, url, process.pid)
    finally:
        process.terminate()  # uvicorn shuts down gracefully on SIGTERM
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()


def server_args(name: str, config: BenchConfig, kind: str, workload: Workload) -> tuple:
    if name == "sluice":
        return serve_sluice, (kind, config.cache_dir)
    assert name == "reference", f"unknown server {name!r}"
    return serve_reference, (workload, config.break_reference)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the load generator (its own process) --------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareSpec:
    """One client process's part of a level."""

    server: str
    url: str
    concurrency: int
    workload: Workload
    duration_s: float
    sample_every: int
    request_timeout_s: float


def run_share(spec: ShareSpec) -> LevelResult:
    """Process entry: one level's streams from this client process."""
    return uvloop.run(_run_share(spec))


async def _run_share(spec: ShareSpec) -> LevelResult:
    result = LevelResult(spec.server, spec.concurrency)
    bodies = (request_body(spec.workload, False), request_body(spec.workload, True))
    numbers = itertools.count()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started_s, cpu_s = time.perf_counter(), time.process_time()
        deadline_s = started_s + spec.duration_s
        workers = [
            _worker(session, spec, bodies, numbers, deadline_s, result)
            for _ in range(spec.concurrency)
        ]
        await asyncio.gather(*workers)
        result.wall_s = time.perf_counter() - started_s
        result.client_cpu_s = time.process_time() - cpu_s
    return result


async def _worker(session, spec, bodies, numbers, deadline_s: float, result: LevelResult) -> None:
    while True:
        is_sampled = next(numbers) % spec.sample_every == 0
        result.num_streams += 1
        try:
            body = await _fetch(session, spec.url, bodies[is_sampled])
            check = check_sampled if is_sampled else count_plain
            result.num_chunks += check(body, spec.workload)
            result.num_tokens += spec.workload.max_tokens
            result.num_checked += is_sampled
        except Exception as error:  # every failed stream is counted, none hides
            result.num_failures += 1
            if len(result.failures) < 3:
                result.failures.append(f"{type(error).__name__}: {error}")
        if time.perf_counter() >= deadline_s:
            return


async def _fetch(session: aiohttp.ClientSession, url: str, body: bytes) -> bytes:
    headers = {"Content-Type": "application/json"}
    async with session.post(url, data=body, headers=headers) as response:
        content = await response.read()
        assert response.status == 200, f"HTTP {response.status}: {content[:200]!r}"
        assert response.content_type == "text/event-stream", "SSE content type"
        return content


# -- the FakeEngine alone -------------------------------------------------------------


class _CountingSink:
    def __init__(self, num_requests: int, done: asyncio.Event):
        self.num_open = num_requests
        self.num_tokens = 0
        self._done = done

    def on_delta(self, delta: RequestDelta) -> None:
        self.num_tokens += len(delta.new_token_ids)
        self.num_open -= delta.is_finished
        if self.num_open == 0:
            self._done.set()

    def on_error(self, error: BaseException) -> None:
        self._done.set()


def engine_tokens_per_s(workload: Workload, num_requests: int) -> float:
    """The FakeEngine's own speed, no frontend: its ceiling on every figure."""

    async def run() -> float:
        engine, done = FakeEngine(step_interval_s=0.0, max_model_len=MAX_MODEL_LEN), asyncio.Event()
        sink = _CountingSink(num_requests, done)
        params = SamplingParams(max_tokens=workload.max_tokens, temperature=0.0)
        started_s = time.perf_counter()
        for i in range(num_requests):
            engine.add_request(
                generation_request(f"r{i}", list(workload.prompt_token_ids), params), sink
            )
        await done.wait()
        return sink.num_tokens / (time.perf_counter() - started_s)

    return uvloop.run(run())


# -- the run --------------------------------------------------------------------------


def run_benchmark(config: BenchConfig) -> BenchReport:
    kind = resolve_tokenizer_kind(config.tokenizer, config.cache_dir)
    workload = build_workload(load_tokenizer(kind, config.cache_dir), config.max_tokens)
    engine_speed = engine_tokens_per_s(workload, max(config.concurrencies))
    report = BenchReport(config, kind, engine_speed, [])
    with ProcessPoolExecutor(config.num_clients, mp_context=_SPAWN) as pool, ExitStack() as stack:
        targets = [
            stack.enter_context(running_server(name, *server_args(name, config, kind, workload)))
            for name in config.servers
        ]
        for target in targets:  # untimed: imports, caches, first connections
            measure_level(pool, target, min(config.concurrencies), config, workload, 0.0)
        for _ in range(config.repeats):
            for concurrency in config.concurrencies:
                for target in targets:
                    report.levels.append(measure_level(pool, target, concurrency, config, workload))
    return report


def measure_level(
    pool: ProcessPoolExecutor,
    target: RunningServer,
    concurrency: int,
    config: BenchConfig,
    workload: Workload,
    duration_s: float | None = None,
) -> LevelResult:
    num_clients = min(config.num_clients, concurrency)
    shares = [
        concurrency // num_clients + (i < concurrency % num_clients) for i in range(num_clients)
    ]
    specs = [
        ShareSpec(
            target.name, target.url, share, workload,
            config.duration_s if duration_s is None else duration_s,
            config.sample_every, config.request_timeout_s,
        )
        for share in shares
    ]  # fmt: skip
    level = LevelResult(target.name, concurrency)
    server_cpu_s = process_cpu_s(target.pid)
    for share_result in pool.map(run_share, specs):
        level.add(share_result)
    level.server_cpu_s = process_cpu_s(target.pid) - server_cpu_s
    return level


# -- the report -----------------------------------------------------------------------


def render_table(report: BenchReport) -> str:
    config = report.config
    lines = [
        f"streaming benchmark: {config.max_tokens} tokens/stream, tokenizer={report.tokenizer}, "
        f"{config.num_clients} client process(es), median of {config.repeats}, "
        f"1 in {config.sample_every} streams fully checked",
        f"FakeEngine alone: {report.engine_tokens_per_s:,.0f} tok/s "
        f"({1e6 / report.engine_tokens_per_s:.1f} µs/tok of the server's CPU)",
        f"{'streams':>7} | {'sluice tok/s':>12} {'chunks/s':>9} {'µs/tok':>7} | "
        f"{'ref tok/s':>10} {'chunks/s':>9} {'µs/tok':>7} | {'ratio':>5} | "
        f"{'checked':>7} {'failed':>6} | client cores",
    ]
    for concurrency in config.concurrencies:
        sluice = report.median("sluice", concurrency)
        reference = report.median("reference", concurrency)
        ratio = report.ratio(concurrency)
        runs = [r for r in report.levels if r.concurrency == concurrency]
        medians = [r for r in (sluice, reference) if r is not None]
        lines.append(
            f"{concurrency:>7} | {_figures(sluice, 12)} | {_figures(reference, 10)} | "
            f"{'-' if ratio is None else f'{ratio:.2f}':>5} | "
            f"{sum(r.num_checked for r in runs):>7} {sum(r.num_failures for r in runs):>6} | "
            + " / ".join(f"{r.client_cores:.2f}" for r in medians)
        )
    for level in report.levels:
        lines.extend(f"FAILED {level.server} @{level.concurrency}: {m}" for m in level.failures)
    verdict = "PASS" if report.is_passed else "FAIL"
    lines.append(
        f"target: sluice >= {TARGET_RATIO:.0%} of the reference's tok/s at "
        f"{max(config.concurrencies)} streams, every check passing: {verdict}"
    )
    return "\n".join(lines)


def _figures(level: LevelResult | None, width: int) -> str:
    if level is None:
        return f"{'-':>{width}} {'-':>9} {'-':>7}"
    return (
        f"{level.tokens_per_s:>{width},.0f} {level.chunks_per_s:>9,.0f} "
        f"{level.server_cpu_us_per_token:>7.1f}"
    )


def report_json(report: BenchReport) -> dict:
    levels = []
    for level in report.levels:
        figures = asdict(level)
        figures.update(
            tokens_per_s=level.tokens_per_s,
            chunks_per_s=level.chunks_per_s,
            server_cpu_us_per_token=level.server_cpu_us_per_token,
            client_cores=level.client_cores,
        )
        levels.append(figures)
    ratios = {str(c): report.ratio(c) for c in report.config.concurrencies}
    config = asdict(report.config) | {"cache_dir": str(report.config.cache_dir)}
    return {
        "config": config,
        "tokenizer": report.tokenizer,
        "engine_tokens_per_s": report.engine_tokens_per_s,
        "levels": levels,
        "ratios": ratios,
        "target_ratio": TARGET_RATIO,
        "passed": report.is_passed,
    }


def parse_args(argv: list[str]) -> tuple[BenchConfig, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,64,512")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--sample-every", type=int, default=16)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tokenizer", choices=("auto", "real", "fake"), default="auto")
    parser.add_argument(
        "--json", nargs="?", const="-", help="write JSON to PATH (- or none: stdout)"
    )
    args = parser.parse_args(argv)
    config = BenchConfig(
        concurrencies=tuple(int(c) for c in args.concurrency.split(",")),
        max_tokens=args.max_tokens,
        duration_s=args.duration_s,
        sample_every=args.sample_every,
        num_clients=args.clients,
        repeats=args.repeats,
        tokenizer=args.tokenizer,
    )
    return config, args.json


def main(argv: list[str]) -> int:
    config, json_path = parse_args(argv)
    report = run_benchmark(config)
    if json_path == "-":
        print(json.dumps(report_json(report), indent=2))
    else:
        print(render_table(report), flush=True)
        if json_path:
            Path(json_path).write_text(json.dumps(report_json(report), indent=2))
    return 0 if report.is_passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
