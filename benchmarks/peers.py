"""sluice as `make serve` starts it, beside the peers installed here, on the same prompts.

    .venv/bin/python benchmarks/peers.py \\
        [--levels 1,16,64] [--max-tokens 128] [--repeats 1] [--long-prompt-tokens 2000] \\
        [--sluice-flags '' --sluice-flags '--dtype bfloat16' ...] \\
        [--vllm-venv /work/peers/vllm | --no-vllm] [--vllm-model HF_FOLDER] [--vllm-flags ...] \\
        [--llama-server PATH [--llama-gguf FILE] [--llama-flags ...]] [--out r.json] [--plot r.png]

Servers (see docs/BENCHMARKS.md, "Peers", for installing them):
- sluice: `.venv/bin/sluice serve --host 127.0.0.1 --port PORT`, the command of
  `make serve`, no other flag; each `--sluice-flags` adds a variant with those
  flags (`''` is the default command; the first given is listed first).
- vLLM's CPU build, when `--vllm-venv` holds one: its OpenAI server on the HF
  folder that sluice converts the embedded model into (bf16, vLLM's default
  for a float32 checkpoint), both cores (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`).
- llama.cpp's `llama-server`, when `--llama-server` names one: the embedded
  GGUF itself, one slot per stream of the highest level, every core.

One server runs at a time (they would share the cores): for each repeat, each
server in turn is started on a free port, waited for, warmed up (short
streams, one long prompt of other text), measured, and stopped with its whole
process group; the order reverses every other repeat, and the report gives
each figure's median over the repeats. Measured per server:
- for each level C: C closed-loop streams (each sends its next request when
  the last ends) of `--max-tokens`-token chat completions, `ignore_eos`,
  temperature 0, the prompts of _load.py: output tokens/s, TTFT p50/p90, ITL
  p50/p90 (definitions in _load.py);
- alone on the idle server: the TTFT of one prompt of `--long-prompt-tokens`
  tokens (counted by the embedded model's tokenizer, before the chat template).

The table gives one row per server and level, and below the peers' rows a
row `sluice / PEER` with each figure's ratio: above 1 for tokens/s and below 1
for times mean sluice is better. JSON (and, where matplotlib is installed, a
PNG bar chart) go to `--out` and `--plot`, by default into the log folder.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from _load import PROMPTS, LevelRun, LoadSpec, RequestRecord, percentile, run_level, send_request
from _load import inter_token_latencies as _itls
from serve import free_port, log_tail, resolve_model, start_server, stop_server, wait_ready

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VLLM_VENV = Path("/work/peers/vllm")
LONG_PROMPT_MAX_TOKENS = 8  # the long prompt measures TTFT; a few tokens make sure text arrives


@dataclass(slots=True, frozen=True)
class Server:
    """One server command to measure."""

    name: str  # "sluice", "sluice --dtype bfloat16", "vllm-cpu", "llama.cpp"
    command: str  # shell-like, "{port}" filled in at start
    is_sluice: bool  # ratios are sluice variants over peers


@dataclass(slots=True, frozen=True)
class LevelResult:
    """One server at one level; times in seconds, None when there was no sample."""

    concurrency: int
    num_requests: int
    num_errors: int
    output_tokens_per_s: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    itl_p50_s: float | None
    itl_p90_s: float | None
    first_error: str | None


@dataclass(slots=True)
class ServerRun:
    """One start of one server: every level, then the long prompt."""

    server: str
    repeat: int  # 0-based
    model: str | None = None  # as GET /v1/models named it
    levels: list[LevelResult] | None = None
    long_prompt_ttft_s: float | None = None
    error: str | None = None  # why the run stopped early, if it did


@dataclass(slots=True, frozen=True)
class ServerSummary:
    """A server's medians over its repeats."""

    server: str
    num_runs: int  # runs that reached the measurements
    levels: list[LevelResult]
    long_prompt_ttft_s: float | None


@dataclass(slots=True, frozen=True)
class Ratio:
    """sluice's figure over a peer's, at one level or for the long prompt."""

    sluice: str
    peer: str
    concurrency: int | None  # None: the long prompt, whose TTFT ratio is in ttft_p50
    output_tokens_per_s: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    itl_p50: float | None
    itl_p90: float | None


# ---- the servers' command lines ------------------------------------------------------------


def sluice_command(sluice_bin: Path, flags: str) -> str:
    """`make serve`'s command (`sluice serve --host 127.0.0.1 --port PORT`) plus `flags`."""
    return " ".join(
        [shlex.quote(str(sluice_bin)), "serve --host 127.0.0.1 --port {port}", flags]
    ).strip()


def vllm_command(venv: Path, model_folder: Path, flags: str) -> str:
    """vLLM-cpu's OpenAI server: its `vllm` script is broken by the package name, so -m."""
    environment = "env VLLM_CPU_NUM_OF_RESERVED_CPU=0 HF_HUB_OFFLINE=1"
    python = shlex.quote(str(venv / "bin" / "python"))
    server = "-m vllm.entrypoints.openai.api_server"
    model = f"--model {shlex.quote(str(model_folder))} --gpu-memory-utilization 0.3"
    address = "--host 127.0.0.1 --port {port}"
    return f"{environment} {python} {server} {model} {address} {flags}".strip()


def llama_command(
    llama_server: Path, gguf: Path, num_slots: int, num_ctx_tokens: int, flags: str
) -> str:
    """llama-server with one slot per stream: its context is split evenly between slots."""
    return (
        f"{shlex.quote(str(llama_server))} -m {shlex.quote(str(gguf))} "
        f"--host 127.0.0.1 --port {{port}} -t {os.cpu_count() or 1} "
        f"-np {num_slots} -c {num_ctx_tokens} {flags}"
    ).strip()


def sluice_name(flags: str) -> str:
    return f"sluice {flags}".strip()


def build_servers(
    args: argparse.Namespace, vllm_model: Path | None, gguf: Path | None
) -> list[Server]:
    """sluice variants first, then the peers that are installed (found paths only)."""
    servers = [
        Server(sluice_name(flags), sluice_command(args.sluice_bin, flags), is_sluice=True)
        for flags in (args.sluice_flags or [""])
    ]
    if vllm_model is not None:
        command = vllm_command(args.vllm_venv, vllm_model, args.vllm_flags)
        servers.append(Server("vllm-cpu", command, is_sluice=False))
    if gguf is not None:
        max_level = max(args.levels)
        # Each slot holds the long prompt (plus its chat template) or a stream.
        tokens_per_slot = args.long_prompt_tokens + args.max_tokens + 256
        command = llama_command(
            args.llama_server, gguf, max_level, max_level * tokens_per_slot, args.llama_flags
        )
        servers.append(Server("llama.cpp", command, is_sluice=False))
    return servers


def server_order(servers: Sequence[Server], repeat: int) -> list[Server]:
    """Given order on even repeats, reversed on odd ones: neither always goes first."""
    return list(servers) if repeat % 2 == 0 else list(reversed(servers))


# ---- prompts -------------------------------------------------------------------------------


def long_prompt(count_tokens: Callable[[str], int], num_tokens: int, opening: str) -> str:
    """At least `num_tokens` tokens: an instruction, then numbered requests from PROMPTS.

    Prompts with different `opening`s differ from their first word (only the
    chat template's system turn comes before it), so a prefix cache filled by
    the warm-up prompt cannot serve the measured one. Lines are counted one
    at a time, so the whole may tokenize a few tokens differently."""
    text = f"{opening} Read this numbered list of requests, then name the longest one.\n"
    lines = (f"{n}. {PROMPTS[n % len(PROMPTS)]}\n" for n in itertools.count(1))
    num_text_tokens = count_tokens(text)
    while num_text_tokens < num_tokens:  # bounded: every line adds at least one token
        line = next(lines)
        text += line
        num_text_tokens += count_tokens(line)
    return text


def embedded_token_counter(cache_dir: Path | None) -> Callable[[str], int]:
    """Counts tokens with the embedded model's tokenizer (converting the GGUF if needed)."""
    from sluice.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(embedded_hf_folder(cache_dir))
    return lambda text: len(tokenizer.encode(text))


def embedded_hf_folder(cache_dir: Path | None) -> Path:
    """The HF folder sluice converts its embedded GGUF into (once, in its cache)."""
    from sluice.config import default_cache_dir
    from sluice.loader.gguf_convert import converted_folder
    from sluice.loader.sources import embedded_gguf_path

    return converted_folder(embedded_gguf_path(), cache_dir or default_cache_dir())


def embedded_gguf() -> Path:
    from sluice.loader.sources import embedded_gguf_path

    return embedded_gguf_path()


# ---- measuring one server ------------------------------------------------------------------


def level_result(concurrency: int, run: LevelRun) -> LevelResult:
    ok = [r for r in run.records if r.error is None]
    errors = [r.error for r in run.records if r.error is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [s for r in ok for s in _itls(r)]
    num_tokens = sum(r.num_output_tokens for r in ok)
    return LevelResult(
        concurrency=concurrency,
        num_requests=len(run.records),
        num_errors=len(errors),
        output_tokens_per_s=num_tokens / max(run.wall_s, 1e-9) if ok else None,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        itl_p50_s=percentile(itls, 50),
        itl_p90_s=percentile(itls, 90),
        first_error=errors[0] if errors else None,
    )


def num_requests_for(concurrency: int, args: argparse.Namespace) -> int:
    return max(concurrency * args.requests_per_stream, args.min_requests)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


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


async def measure_running(
    run: ServerRun,
    base_url: str,
    process: subprocess.Popen,
    args: argparse.Namespace,
    prompts: dict[str, str],
) -> None:
    """Fill `run` from a started server: wait, warm up, every level, the long prompt."""
    connector = aiohttp.TCPConnector(limit=max(args.levels) + 1)
    async with aiohttp.ClientSession(connector=connector) as session:
        # 1. Wait until it answers, and learn the name it serves the model under.
        await wait_ready(session, base_url, args.startup_timeout, process)
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
        long_spec = LoadSpec(**{**asdict(spec), "max_tokens": LONG_PROMPT_MAX_TOKENS})
        # 2. Warm up: short streams, and one long prompt of other text.
        if args.warmup:
            say(f"  warm-up: {args.warmup} streams, then a long prompt")
            warm_spec = LoadSpec(**{**asdict(spec), "max_tokens": min(32, args.max_tokens)})
            await run_level(session, warm_spec, min(args.warmup, max(args.levels)), args.warmup)
            if prompts.get("warmup"):
                await _long_prompt_ttft(session, long_spec, prompts["warmup"])
        # 3. The long prompt alone on the idle server.
        if prompts.get("long"):
            ttft_s, error = await _long_prompt_ttft(session, long_spec, prompts["long"])
            run.long_prompt_ttft_s = ttft_s
            say(f"  long prompt: TTFT {_ms(ttft_s)} ms {error}".rstrip())
        # 4. Closed-loop streams at every level.
        run.levels = []
        for concurrency in args.levels:
            num_requests = num_requests_for(concurrency, args)
            progress = _Progress(f"C={concurrency}", num_requests)
            level_run = await run_level(session, spec, concurrency, num_requests, progress)
            result = level_result(concurrency, level_run)
            run.levels.append(result)
            say(
                f"  C={concurrency}: {_num(result.output_tokens_per_s)} tok/s, "
                f"TTFT p50 {_ms(result.ttft_p50_s)} ms, ITL p50 {_ms(result.itl_p50_s)} ms, "
                f"{result.num_errors}/{num_requests} errors, {level_run.wall_s:.1f} s"
            )


def wait_group_gone(pgid: int, timeout_s: float = 30.0) -> bool:
    """True once no process of the group is left (its children too), within timeout_s."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:  # bounded by timeout_s
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the whole group; raises if any of it survives."""
    stop_server(process)
    if not wait_group_gone(process.pid, 10.0):
        os.killpg(process.pid, signal.SIGKILL)
        if not wait_group_gone(process.pid, 20.0):
            raise RuntimeError(f"process group {process.pid} survived SIGKILL")


def measure(
    server: Server, repeat: int, args: argparse.Namespace, prompts: dict[str, str], log_dir: Path
) -> ServerRun:
    """Start, measure and stop one server; a failure lands in .error with its log's tail."""
    run = ServerRun(server=server.name, repeat=repeat)
    port = free_port()
    log_path = log_dir / f"{server.name.replace(' ', '_').replace('/', '_')}-{repeat}.log"
    process = start_server(server.command, port, log_path)
    try:
        asyncio.run(measure_running(run, f"http://127.0.0.1:{port}", process, args, prompts))
    except (TimeoutError, RuntimeError, aiohttp.ClientError, KeyError) as error:
        run.error = f"{type(error).__name__}: {error}"
        print(f"{server.name} failed: {run.error}\n{log_tail(log_path)}", file=sys.stderr)
    finally:
        stop_group(process)
        say(f"  stopped {server.name}")
    return run


# ---- medians, ratios, the table ------------------------------------------------------------

_LEVEL_METRICS = ("output_tokens_per_s", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s")


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(server: str, runs: list[ServerRun]) -> ServerSummary:
    """Each figure's median over the runs that have it."""
    measured = [r for r in runs if r.levels]
    by_level: dict[int, list[LevelResult]] = {}
    for run in measured:
        for level in run.levels or []:
            by_level.setdefault(level.concurrency, []).append(level)
    levels = []
    for concurrency, results in by_level.items():
        medians = {m: _median([getattr(r, m) for r in results]) for m in _LEVEL_METRICS}
        levels.append(
            LevelResult(
                concurrency=concurrency,
                num_requests=sum(r.num_requests for r in results),
                num_errors=sum(r.num_errors for r in results),
                first_error=next((r.first_error for r in results if r.first_error), None),
                **medians,
            )
        )
    return ServerSummary(
        server=server,
        num_runs=len(measured),
        levels=levels,
        long_prompt_ttft_s=_median([r.long_prompt_ttft_s for r in runs]),
    )


def _over(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def ratios(summaries: list[ServerSummary], sluice_names: set[str]) -> list[Ratio]:
    """Every sluice variant over every peer, per level, then the long prompt's TTFT."""
    out = []
    sluices = [s for s in summaries if s.server in sluice_names]
    peers = [s for s in summaries if s.server not in sluice_names]
    for sluice, peer in itertools.product(sluices, peers):
        peer_levels = {level.concurrency: level for level in peer.levels}
        for level in sluice.levels:
            other = peer_levels.get(level.concurrency)
            if other is None:
                continue
            out.append(
                Ratio(
                    sluice.server,
                    peer.server,
                    level.concurrency,
                    _over(level.output_tokens_per_s, other.output_tokens_per_s),
                    _over(level.ttft_p50_s, other.ttft_p50_s),
                    _over(level.ttft_p90_s, other.ttft_p90_s),
                    _over(level.itl_p50_s, other.itl_p50_s),
                    _over(level.itl_p90_s, other.itl_p90_s),
                )
            )
        long_ratio = _over(sluice.long_prompt_ttft_s, peer.long_prompt_ttft_s)
        out.append(Ratio(sluice.server, peer.server, None, None, long_ratio, None, None, None))
    return out


_HEADER = ("C", "server", "tok/s", "TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "errors")


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def table_rows(
    summaries: list[ServerSummary], all_ratios: list[Ratio], long_prompt_tokens: int
) -> list[tuple[str, ...]]:
    """Per level: each server's figures (times in ms), then each sluice / peer ratio."""
    rows: list[tuple[str, ...]] = []
    levels = sorted({level.concurrency for s in summaries for level in s.levels})
    for concurrency in levels:
        for summary in summaries:
            for level in summary.levels:
                if level.concurrency == concurrency:
                    rows.append(
                        (
                            str(concurrency),
                            summary.server,
                            _num(level.output_tokens_per_s),
                            _ms(level.ttft_p50_s),
                            _ms(level.ttft_p90_s),
                            _ms(level.itl_p50_s),
                            _ms(level.itl_p90_s),
                            f"{level.num_errors}/{level.num_requests}",
                        )
                    )
        for ratio in all_ratios:
            if ratio.concurrency == concurrency:
                figures = (ratio.output_tokens_per_s, ratio.ttft_p50, ratio.ttft_p90)
                figures += (ratio.itl_p50, ratio.itl_p90)
                cells = tuple(_num(v, 2) for v in figures)
                rows.append((str(concurrency), f"{ratio.sluice} / {ratio.peer}", *cells, ""))
    if long_prompt_tokens:
        label = f"{long_prompt_tokens}-token prompt"
        for summary in summaries:
            rows.append(
                (label, summary.server, "", _ms(summary.long_prompt_ttft_s), "", "", "", "")
            )
        for ratio in all_ratios:
            if ratio.concurrency is None:
                name = f"{ratio.sluice} / {ratio.peer}"
                rows.append((label, name, "", _num(ratio.ttft_p50, 2), "", "", "", ""))
    return rows


def format_table(rows: list[tuple[str, ...]]) -> str:
    """Aligned columns; the server column left-aligned, figures right-aligned."""
    all_rows = [_HEADER, *rows]
    widths = [max(len(row[i]) for row in all_rows) for i in range(len(_HEADER))]
    lines = []
    for row in all_rows:
        cells = [
            cell.ljust(w) if i == 1 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    note = (
        "times in ms; tok/s = output tokens/s of the level; a 'sluice / peer' row is the "
        "ratio of the figures above it: >1 tok/s and <1 times mean sluice is better"
    )
    return "\n".join([*lines, note])


# ---- reports: JSON and PNG ------------------------------------------------------------------


def package_version(python: Path, distribution: str) -> str | None:
    """`distribution`'s version as the interpreter `python` sees it (None if absent)."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    try:
        done = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def machine_facts() -> dict:
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
    return {
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "has_amx": "amx_tile" in flags.split(),
        "has_avx512_bf16": "avx512_bf16" in flags.split(),
    }


def results_json(
    args: argparse.Namespace,
    servers: list[Server],
    versions: dict,
    runs: list[ServerRun],
    summaries: list[ServerSummary],
    all_ratios: list[Ratio],
) -> dict:
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {
        "config": config,
        "machine": machine_facts(),
        "servers": [asdict(s) for s in servers],
        "versions": versions,
        "runs": [asdict(r) for r in runs],
        "medians": [asdict(s) for s in summaries],
        "ratios": [asdict(r) for r in all_ratios],
    }


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_png(path: Path, summaries: list[ServerSummary], long_prompt_tokens: int) -> None:
    """Grouped bars per level: tokens/s, TTFT p50, ITL p50; and the long prompt's TTFT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({level.concurrency for s in summaries for level in s.levels})
    panels = [
        ("output tokens/s", "output_tokens_per_s", 1.0),
        ("TTFT p50 (ms)", "ttft_p50_s", 1e3),
        ("ITL p50 (ms)", "itl_p50_s", 1e3),
    ]
    num_panels = len(panels) + (1 if long_prompt_tokens else 0)
    figure, axes = plt.subplots(1, num_panels, figsize=(4.3 * num_panels, 4.2))
    width = 0.8 / max(len(summaries), 1)
    for axis, (title, metric, scale) in zip(axes, panels, strict=False):
        for index, summary in enumerate(summaries):
            by_level = {level.concurrency: getattr(level, metric) for level in summary.levels}
            heights = [(by_level.get(c) or 0.0) * scale for c in levels]
            xs = [i + (index - (len(summaries) - 1) / 2) * width for i in range(len(levels))]
            axis.bar(xs, heights, width, label=summary.server)
        axis.set_xticks(range(len(levels)), [str(c) for c in levels])
        axis.set_xlabel("concurrent streams")
        axis.set_title(title)
    if long_prompt_tokens:  # one bar per server, in the servers' colours
        names = [s.server for s in summaries]
        colors = [f"C{index}" for index in range(len(summaries))]
        axes[3].bar(names, [(s.long_prompt_ttft_s or 0.0) for s in summaries], color=colors)
        axes[3].set_title(f"TTFT (s), one {long_prompt_tokens}-token prompt")
        axes[3].tick_params(axis="x", labelrotation=20)
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---- command line --------------------------------------------------------------------------


def _levels(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"levels are integers, e.g. 1,16,64: {text!r}") from error
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"levels are positive integers: {text!r}")
    return levels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload = parser.add_argument_group("workload")
    workload.add_argument(
        "--levels", type=_levels, default=[1, 16, 64], help="streams, e.g. 1,16,64"
    )
    workload.add_argument("--max-tokens", type=int, default=128, help="tokens per completion")
    workload.add_argument(
        "--requests-per-stream", type=int, default=2, help="a level sends C x this requests..."
    )
    workload.add_argument("--min-requests", type=int, default=8, help="...and at least this many")
    workload.add_argument(
        "--long-prompt-tokens", type=int, default=2000, help="0 skips the long prompt"
    )
    workload.add_argument("--repeats", type=int, default=1, help="server order alternates")
    workload.add_argument("--warmup", type=int, default=4, help="warm-up streams (0: none)")
    sluice = parser.add_argument_group("sluice")
    sluice.add_argument(
        "--sluice-flags",
        action="append",
        default=None,
        metavar="FLAGS",
        help="a sluice variant with these serve flags; repeatable; '' is `make serve`'s command",
    )
    sluice.add_argument("--sluice-bin", type=Path, default=ROOT / ".venv" / "bin" / "sluice")
    sluice.add_argument("--cache-dir", type=Path, default=None, help="sluice's model cache")
    vllm = parser.add_argument_group("vLLM-cpu")
    vllm.add_argument("--vllm-venv", type=Path, default=DEFAULT_VLLM_VENV)
    vllm.add_argument("--no-vllm", action="store_true", help="leave vLLM out even if installed")
    vllm.add_argument(
        "--vllm-model", type=Path, default=None, help="HF folder (default: sluice's conversion)"
    )
    vllm.add_argument("--vllm-flags", default="", metavar="FLAGS", help="more server flags")
    llama = parser.add_argument_group("llama.cpp")
    llama.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary")
    llama.add_argument("--llama-gguf", type=Path, default=None, help="default: embedded GGUF")
    llama.add_argument("--llama-flags", default="", metavar="FLAGS", help="more server flags")
    run = parser.add_argument_group("run")
    run.add_argument("--startup-timeout", type=float, default=900.0, help="seconds")
    run.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    run.add_argument("--log-dir", type=Path, default=None, help="default: a temp dir")
    run.add_argument("--out", type=Path, default=None, help="JSON (default: LOG_DIR/peers.json)")
    run.add_argument(
        "--plot", type=Path, default=None, help="PNG, needs matplotlib (default: LOG_DIR/peers.png)"
    )
    return parser


def check_args(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot run, or None."""
    if args.max_tokens < 1 or args.repeats < 1 or args.requests_per_stream < 1:
        return "--max-tokens, --repeats and --requests-per-stream must be at least 1"
    if args.long_prompt_tokens < 0 or args.warmup < 0 or args.min_requests < 0:
        return "--long-prompt-tokens, --warmup and --min-requests cannot be negative"
    names = [sluice_name(flags) for flags in (args.sluice_flags or [""])]
    if len(set(names)) != len(names):
        return "two --sluice-flags give the same variant"
    if not args.sluice_bin.exists():
        return f"no sluice at {args.sluice_bin}: run `make serve` or `make test` once"
    if args.llama_server is not None and not args.llama_server.exists():
        return f"no llama-server at {args.llama_server}"
    return None


def find_vllm(args: argparse.Namespace) -> bool:
    if args.no_vllm:
        return False
    if (args.vllm_venv / "bin" / "python").exists():
        return True
    say(f"no vLLM venv at {args.vllm_venv}: vLLM left out (docs/BENCHMARKS.md, Peers)")
    return False


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops the server


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="sluice-peers-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    # 1. The servers that are installed, and the prompts they all get.
    has_vllm = find_vllm(args)
    vllm_model = (args.vllm_model or embedded_hf_folder(args.cache_dir)) if has_vllm else None
    gguf = (args.llama_gguf or embedded_gguf()) if args.llama_server else None
    servers = build_servers(args, vllm_model, gguf)
    prompts: dict[str, str] = {}
    if args.long_prompt_tokens:
        count_tokens = embedded_token_counter(args.cache_dir)
        prompts["long"] = long_prompt(count_tokens, args.long_prompt_tokens, "Measured.")
        prompts["warmup"] = long_prompt(count_tokens, args.long_prompt_tokens, "Warm-up:")
    versions = {"sluice": package_version(Path(sys.executable), "sluice")}
    if has_vllm:
        versions["vllm-cpu"] = package_version(args.vllm_venv / "bin" / "python", "vllm-cpu")
    say(f"servers: {', '.join(s.name for s in servers)}; versions {versions}; logs in {log_dir}")
    # 2. One server at a time; the order reverses every other repeat.
    runs: list[ServerRun] = []
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        for repeat in range(args.repeats):
            for server in server_order(servers, repeat):
                say(f"repeat {repeat + 1}/{args.repeats}: {server.name}")
                runs.append(measure(server, repeat, args, prompts, log_dir))
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    # 3. Medians, ratios, the table and the files.
    summaries = [summarize(s.name, [r for r in runs if r.server == s.name]) for s in servers]
    all_ratios = ratios(summaries, {s.name for s in servers if s.is_sluice})
    print(format_table(table_rows(summaries, all_ratios, args.long_prompt_tokens)))
    for run in runs:
        if run.error:
            print(f"{run.server}, repeat {run.repeat + 1}: {run.error}")
    out = args.out or log_dir / "peers.json"
    out.write_text(
        json.dumps(results_json(args, servers, versions, runs, summaries, all_ratios), indent=2)
    )
    say(f"results: {out}")
    if has_matplotlib():
        plot = args.plot or log_dir / "peers.png"
        write_png(plot, summaries, args.long_prompt_tokens)
        say(f"chart: {plot}")
    else:
        say("matplotlib is not installed in this venv: no chart")
    return 0 if all(r.error is None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
