"""Data-parallel scaling on one machine: 1 replica with T threads vs 2 replicas with T/2 each.

    .venv/bin/python benchmarks/data_parallel.py [--threads 2] [--streams 64] \\
        [--requests 128] [--max-tokens 64] [--single-engine] [--out results.json]

Each layout is `sluice serve --data-parallel N --replica-cpus T/N --num-threads T/N`
(a local Ray instance), started in its own process group and measured with
the streaming load generator of serve.py (`_load.run_level`): `--streams`
concurrent streams until `--requests` are done, after a warm-up. The
machine's threads are split between the replicas, so the comparison is what
data parallelism buys on the same cores: one engine batching 64 streams
against two engines batching 32 each. `--single-engine` adds plain
`sluice serve --num-threads T` (no Ray) as the reference for the Ray hop.

Besides tokens/s, it reports what the frontend costs: the CPU time of the
server process (HTTP, SSE, detokenizing, routing; the engines run in other
processes) per generated token, and, measured alone in this process, the
router's own share (route + the per-delta bookkeeping) per token.

The load generator shares the machine with the server; on a small machine
its cost is in the numbers for every layout alike.
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
import psutil
from _load import LoadSpec, level_stats, run_level
from serve import free_port, log_tail, resolve_model, start_server, stop_server, wait_ready

ROUTER_TOKENS_PER_REQUEST = 64


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    # `sluice serve` flags besides host and port.
    flags: tuple[str, ...]


@dataclass(slots=True)
class LayoutResult:
    name: str
    output_tokens_per_s: float
    num_tokens: int
    num_errors: int
    ttft_p50_s: float | None
    itl_p50_s: float | None
    # CPU seconds of the server process (the frontend) per generated token.
    frontend_cpu_us_per_token: float


def layouts(threads: int, single_engine: bool) -> list[Layout]:
    half = max(1, threads // 2)
    chosen = [
        Layout(f"1 replica x {threads} threads",
               ("--data-parallel", "1", "--replica-cpus", str(threads), "--num-threads", str(threads))),
        Layout(f"2 replicas x {half} threads",
               ("--data-parallel", "2", "--replica-cpus", str(half), "--num-threads", str(half))),
    ]  # fmt: skip
    if single_engine:
        chosen.insert(0, Layout(f"no Ray, 1 engine x {threads} threads",
                                ("--num-threads", str(threads))))  # fmt: skip
    return chosen


def measure(layout: Layout, args: argparse.Namespace, log_dir: Path) -> LayoutResult:
    port = free_port()
    command = " ".join([args.sluice, "serve", "--host", "127.0.0.1", "--port", "{port}",
                        *layout.flags, *args.serve_flags])  # fmt: skip
    log_path = log_dir / f"{layout.name.replace(' ', '_')}.log"
    process = start_server(command, port, log_path)
    try:
        return asyncio.run(_load(layout, f"http://127.0.0.1:{port}", process, args))
    except Exception:
        print(log_tail(log_path), file=sys.stderr)
        raise
    finally:
        stop_server(process)


async def _load(layout: Layout, base_url: str, process, args) -> LayoutResult:
    connector = aiohttp.TCPConnector(limit=args.streams)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_ready(session, base_url, args.startup_timeout, process)
        spec = LoadSpec(base_url=base_url, model=await resolve_model(session, base_url, None),
                        api="completions", max_tokens=args.max_tokens, ignore_eos=True,
                        continuous_usage=False, request_timeout_s=args.request_timeout)  # fmt: skip
        await run_level(session, spec, min(args.streams, 8), min(args.requests, 8))  # warm-up
        server = psutil.Process(process.pid)
        cpu_before_s = _cpu_s(server)
        stats = level_stats(
            args.streams, await run_level(session, spec, args.streams, args.requests)
        )
        cpu_s = _cpu_s(server) - cpu_before_s
    num_tokens = stats.num_output_tokens
    result = LayoutResult(
        name=layout.name,
        output_tokens_per_s=stats.output_tokens_per_s,
        num_tokens=num_tokens,
        num_errors=stats.num_errors,
        ttft_p50_s=stats.ttft_p50_s,
        itl_p50_s=stats.itl_p50_s,
        frontend_cpu_us_per_token=1e6 * cpu_s / max(1, num_tokens),
    )
    print(f"  {layout.name}: {result.output_tokens_per_s:.1f} tok/s, {result.num_errors} errors, "
          f"frontend {result.frontend_cpu_us_per_token:.0f} us CPU/token", flush=True)  # fmt: skip
    return result


def _cpu_s(process: psutil.Process) -> float:
    """CPU seconds of the process itself (its children, the engines, excluded)."""
    times = process.cpu_times()
    return times.user + times.system


def router_us_per_token(num_replicas: int = 2, num_requests: int = 2048) -> float:
    """The router's own cost per token: route each request, then one delta per token."""
    from sluice.engine.outputs import RequestDelta
    from sluice.scaleout.router import ReplicaRouter

    router = ReplicaRouter(num_replicas, 16)
    healthy = list(range(num_replicas))
    prompt = list(range(100, 140))
    deltas = [[RequestDelta(f"r{i}", (7,), None, None, None, len(prompt))
               for _ in range(ROUTER_TOKENS_PER_REQUEST - 1)] for i in range(num_requests)]  # fmt: skip
    started_s = time.process_time()
    for i in range(num_requests):
        router.route(f"r{i}", [i, *prompt], ROUTER_TOKENS_PER_REQUEST, healthy)
        for delta in deltas[i]:
            router.on_delta(delta)
        router.finish(f"r{i}")
    elapsed_s = time.process_time() - started_s
    return 1e6 * elapsed_s / (num_requests * ROUTER_TOKENS_PER_REQUEST)


def report(results: list[LayoutResult], router_us: float) -> str:
    lines = [f"{'layout':<34} {'tok/s':>8} {'errors':>6} {'TTFT p50 ms':>11} "
             f"{'ITL p50 ms':>10} {'frontend us CPU/token':>22}"]  # fmt: skip
    for r in results:
        ttft = "-" if r.ttft_p50_s is None else f"{1000 * r.ttft_p50_s:.0f}"
        itl = "-" if r.itl_p50_s is None else f"{1000 * r.itl_p50_s:.1f}"
        lines.append(f"{r.name:<34} {r.output_tokens_per_s:>8.1f} {r.num_errors:>6} "
                     f"{ttft:>11} {itl:>10} {r.frontend_cpu_us_per_token:>22.0f}")  # fmt: skip
    one, two = results[-2], results[-1]
    if one.output_tokens_per_s > 0:
        lines.append(
            f"scaling (2 replicas / 1): {two.output_tokens_per_s / one.output_tokens_per_s:.2f}x"
        )
    lines.append(f"router alone (route + per-delta bookkeeping): {router_us:.2f} us per token")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="threads split between replicas")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--single-engine", action="store_true", help="add sluice without Ray")
    parser.add_argument("--sluice", default=f"{sys.executable} -m sluice.cli")
    parser.add_argument("--serve-flag", dest="serve_flags", action="append", default=[],
                        help="extra `sluice serve` flag (repeat), e.g. --serve-flag=--dtype=float32")  # fmt: skip
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=None, help="results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="sluice-dp-bench-"))
    results = [measure(layout, args, log_dir)
               for layout in layouts(args.threads, args.single_engine)]  # fmt: skip
    router_us = router_us_per_token()
    print(report(results, router_us))
    if args.out is not None:
        body = {"results": [asdict(r) for r in results], "router_us_per_token": router_us,
                "args": {k: v for k, v in vars(args).items() if k != "out"}}  # fmt: skip
        args.out.write_text(json.dumps(body, indent=2, default=str))
    return 0 if all(r.num_errors == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
