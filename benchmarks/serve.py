"""Streaming load benchmark for any OpenAI-compatible server, servers side by side.

    .venv/bin/python benchmarks/serve.py \\
        --server 'sluice=.venv/bin/sluice serve --port {port}' \\
        [--server 'other=COMMAND with {port}' ...] [--base-url NAME=URL ...] \\
        [--model NAME] --concurrency 1,16,64 --requests-per-level 64 --max-tokens 64 \\
        [--api chat|completions] [--ignore-eos] [--out results.json] [--plot plot.svg]

Each `--server` gets a free port on 127.0.0.1; its command (with `{port}`
filled in) runs in its own process group, logging to a file, until GET
/v1/models or /health answers; then a warm-up request, every concurrency level
in order, and SIGTERM (SIGKILL after 10 s). `--base-url` measures a server that
is already running. Targets run one after another with the same prompts, in
command-line order; the first is the baseline for the ratio
columns. Metric definitions (TTFT, ITL per token, tokens/s) are in _load.py.

The benchmark client shares the CPU with the server when both run here, so
numbers on a small machine include its (small) cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from _load import PROMPTS, LevelStats, LoadSpec, level_stats, run_level


@dataclass(slots=True, frozen=True)
class Target:
    """One server to measure: launched from `command`, or already at `base_url`."""

    name: str
    command: str | None  # shell-like command with "{port}"; None for --base-url targets
    base_url: str | None


@dataclass(slots=True)
class ServerResult:
    name: str
    base_url: str
    model: str
    levels: list[LevelStats]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(command: str, port: int, log_path: Path) -> subprocess.Popen:
    argv = shlex.split(command.replace("{port}", str(port)))
    print(
        f"[{time.strftime('%H:%M:%S')}] starting: {shlex.join(argv)}  (log: {log_path})", flush=True
    )
    with open(log_path, "wb") as log:
        # Own session = own process group, so stopping it reaches its children too.
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_server(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def log_tail(log_path: Path, num_lines: int = 20) -> str:
    lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    return "\n".join(lines[-num_lines:])


async def wait_ready(
    session: aiohttp.ClientSession,
    base_url: str,
    timeout_s: float,
    process: subprocess.Popen | None,
) -> None:
    """Poll /v1/models then /health until one answers 200; progress every 10 s."""
    start_s = time.monotonic()
    next_report_s = start_s + 10.0
    while time.monotonic() - start_s < timeout_s:  # bounded by timeout_s
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode} before ready")
        for path in ("/v1/models", "/health"):
            try:
                async with session.get(
                    base_url + path, timeout=aiohttp.ClientTimeout(total=5)
                ) as response:
                    if response.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
        if time.monotonic() >= next_report_s:
            print(f"  waiting for {base_url}: {time.monotonic() - start_s:.0f} s", flush=True)
            next_report_s += 10.0
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{base_url} not ready after {timeout_s:.0f} s")


async def resolve_model(session: aiohttp.ClientSession, base_url: str, model: str | None) -> str:
    if model:
        return model
    timeout = aiohttp.ClientTimeout(total=30)
    async with session.get(base_url + "/v1/models", timeout=timeout) as response:
        response.raise_for_status()
        return (await response.json())["data"][0]["id"]


async def run_target(
    name: str, base_url: str, process: subprocess.Popen | None, args: argparse.Namespace
) -> ServerResult:
    connector = aiohttp.TCPConnector(limit=max(args.concurrency))
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_ready(session, base_url, args.startup_timeout, process)
        model = await resolve_model(session, base_url, args.model)
        spec = LoadSpec(
            base_url=base_url,
            model=model,
            api=args.api,
            max_tokens=args.max_tokens,
            ignore_eos=args.ignore_eos,
            continuous_usage=args.continuous_usage,
            request_timeout_s=args.request_timeout,
        )
        if args.warmup:
            await run_level(session, spec, 1, args.warmup)
        levels = []
        for concurrency in args.concurrency:
            stats = level_stats(
                concurrency, await run_level(session, spec, concurrency, args.requests_per_level)
            )
            print(
                f"  C={concurrency}: {stats.output_tokens_per_s:.1f} tok/s, "
                f"{stats.num_errors} errors, {stats.wall_s:.1f} s",
                flush=True,
            )
            levels.append(stats)
        return ServerResult(name=name, base_url=base_url, model=model, levels=levels)


def measure(target: Target, args: argparse.Namespace, log_dir: Path) -> ServerResult | None:
    """Start (if needed), load and stop one target; None, with the reason printed, on failure."""
    process, log_path = None, None
    base_url = (target.base_url or "").rstrip("/")
    if target.command is not None:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        log_path = log_dir / f"{target.name}.log"
        process = start_server(target.command, port, log_path)
    print(f"== {target.name} at {base_url}", flush=True)
    try:
        return asyncio.run(run_target(target.name, base_url, process, args))
    except (TimeoutError, RuntimeError, aiohttp.ClientError, KeyError) as error:
        print(f"{target.name} failed: {type(error).__name__}: {error}", file=sys.stderr)
        if log_path is not None:
            print(log_tail(log_path), file=sys.stderr)
        return None
    finally:
        if process is not None:
            stop_server(process)


# ---- report: table, JSON, SVG ------------------------------------------------------------

_COLUMNS = (
    "server",
    "C",
    "reqs",
    "err",
    "ttft50ms",
    "ttft99ms",
    "itl50ms",
    "itl99ms",
    "e2e50s",
    "tok/s",
    "req/s",
    "x tok/s",
    "x itl50",
    "x ttft50",
)


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def table_rows(results: list[ServerResult]) -> list[tuple[str, ...]]:
    """One row per server and level; ratios against the first server at the same C."""
    baseline = {s.concurrency: s for s in results[0].levels} if results else {}
    rows = []
    for result in results:
        for s in result.levels:
            base = baseline.get(s.concurrency)
            rows.append(
                (
                    result.name,
                    str(s.concurrency),
                    str(s.num_requests),
                    str(s.num_errors),
                    _fmt(s.ttft_p50_s, 1e3),
                    _fmt(s.ttft_p99_s, 1e3),
                    _fmt(s.itl_p50_s, 1e3),
                    _fmt(s.itl_p99_s, 1e3),
                    _fmt(s.e2e_p50_s, 1, 2),
                    _fmt(s.output_tokens_per_s),
                    _fmt(s.requests_per_s, 1, 2),
                    _ratio(s.output_tokens_per_s, base and base.output_tokens_per_s),
                    _ratio(s.itl_p50_s, base and base.itl_p50_s),
                    _ratio(s.ttft_p50_s, base and base.ttft_p50_s),
                )
            )
    return rows


def format_table(results: list[ServerResult]) -> str:
    rows = [_COLUMNS, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    errors = [
        f"{r.name} C={s.concurrency}: {s.first_error}"
        for r in results
        for s in r.levels
        if s.first_error
    ]
    return "\n".join(lines + [f"first error, {e}" for e in errors])


def results_json(results: list[ServerResult], args: argparse.Namespace) -> dict:
    config = {**vars(args), "targets": [asdict(target) for target in args.targets]}
    return {
        "config": config,
        "prompts": list(PROMPTS),
        "servers": [asdict(result) for result in results],
    }


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (the axis top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(k * power for k in (1, 2, 5, 10) if k * power >= value * (1 - 1e-9))


def _panel(x0: int, title: str, levels: list[int], series: list[tuple[str, list]]) -> list[str]:
    """One line chart 400x260 at x0: categorical x (concurrency), linear y from 0."""
    left, top, width, height = x0 + 60, 50, 330, 250
    y_max = _nice_ceiling(
        max((v for _, vals in series for v in vals if v is not None), default=1.0)
    )
    xs = [left + width * (i + 0.5) / len(levels) for i in range(len(levels))]
    out = [
        f'<text x="{left + width / 2}" y="30" text-anchor="middle" '
        f'font-weight="bold">{title}</text>',
        f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#444"/>',
    ]
    for k in range(5):  # gridlines and y labels at 0, 25, 50, 75, 100 %
        y = top + height * (1 - k / 4)
        out.append(f'<line x1="{left}" y1="{y}" x2="{left + width}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{y_max * k / 4:g}</text>')
    for x, level in zip(xs, levels, strict=True):
        out.append(f'<text x="{x}" y="{top + height + 18}" text-anchor="middle">{level}</text>')
    out.append(
        f'<text x="{left + width / 2}" y="{top + height + 38}" '
        'text-anchor="middle">concurrency</text>'
    )
    for index, (_name, values) in enumerate(series):
        color = _COLORS[index % len(_COLORS)]
        points = [
            (x, top + height * (1 - v / y_max))
            for x, v in zip(xs, values, strict=True)
            if v is not None
        ]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>' for x, y in points]
    return out


def render_svg(results: list[ServerResult]) -> str:
    """Two panels: output tokens/s and ITL p50 (ms) per concurrency, one line per server."""
    from xml.sax.saxutils import escape

    levels = sorted({s.concurrency for r in results for s in r.levels})

    def values(result: ServerResult, metric: str, scale: float) -> list[float | None]:
        by_level = {s.concurrency: getattr(s, metric) for s in result.levels}
        return [None if by_level.get(c) is None else by_level[c] * scale for c in levels]

    tok = [(r.name, values(r, "output_tokens_per_s", 1.0)) for r in results]
    itl = [(r.name, values(r, "itl_p50_s", 1e3)) for r in results]
    body = _panel(0, "output tokens/s", levels, tok) + _panel(420, "ITL p50 (ms)", levels, itl)
    for index, result in enumerate(results):  # legend along the bottom
        x, color = 70 + 160 * index, _COLORS[index % len(_COLORS)]
        body.append(f'<rect x="{x}" y="352" width="14" height="4" fill="{color}"/>')
        body.append(f'<text x="{x + 20}" y="358">{escape(result.name)}</text>')
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="840" height="375" '
        'font-family="sans-serif" font-size="12">\n'
        '<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )


# ---- command line --------------------------------------------------------------------------


def _named(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _server_target(text: str) -> Target:
    name, command = _named(text)
    return Target(name=name, command=command, base_url=None)


def _url_target(text: str) -> Target:
    name, url = _named(text)
    return Target(name=name, command=None, base_url=url)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Both flags append to one list so targets run, and compare, in command-line order.
    parser.add_argument(
        "--server",
        dest="targets",
        action="append",
        default=[],
        type=_server_target,
        metavar="NAME=COMMAND",
        help="COMMAND contains {port}; repeatable",
    )
    parser.add_argument(
        "--base-url",
        dest="targets",
        action="append",
        type=_url_target,
        metavar="NAME=URL",
        help="a server already running; repeatable",
    )
    parser.add_argument("--model", default=None, help="default: first id of GET /v1/models")
    levels = lambda text: [int(c) for c in text.split(",") if c.strip()]  # noqa: E731
    parser.add_argument("--concurrency", default=[1, 16, 64], type=levels, help="e.g. 1,16,64")
    parser.add_argument("--requests-per-level", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--api", choices=["chat", "completions"], default="chat")
    parser.add_argument("--ignore-eos", action="store_true")
    help_usage = "ask for usage on every chunk: exact tokens per chunk for ITL"
    parser.add_argument("--continuous-usage", action="store_true", help=help_usage)
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured requests first")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--log-dir", default=None, help="server logs (default: a temp dir)")
    parser.add_argument("--out", default=None, help="write results as JSON here")
    parser.add_argument("--plot", default=None, help="write an SVG plot here")
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops the server


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    targets: list[Target] = args.targets
    if not targets or not args.concurrency or min(args.concurrency) < 1:
        print("need at least one --server or --base-url and positive levels", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="sluice-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        results = [r for r in (measure(t, args, log_dir) for t in targets) if r is not None]
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    print(format_table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results_json(results, args), indent=2))
    if args.plot:
        Path(args.plot).write_text(render_svg(results))
    return 0 if len(results) == len(targets) else 1


if __name__ == "__main__":
    sys.exit(main())
