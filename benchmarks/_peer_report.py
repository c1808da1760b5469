"""What peers.py measured, and its report: medians over repeats, ratios, the table.

Every figure of a server is the median over its runs that have it; a ratio is
always a sluice variant's median over a peer's (`sluice / PEER`), per level
and per long-prompt length. Times are in seconds here and in ms in the table.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from _load import LevelRun, percentile
from _load import inter_token_latencies as _itls


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
    """One start of one server: the long prompts, then every level."""

    server: str
    repeat: int  # 0-based
    model: str | None = None  # as GET /v1/models named it
    levels: list[LevelResult] | None = None
    # prompt tokens asked for -> TTFT of that run's one prompt of that length (None: failed)
    long_prompt_ttft_s: dict[int, float | None] = field(default_factory=dict)
    # From the process's start to its first answer, and the resident memory
    # of its whole process group after the last level (MiB).
    startup_s: float | None = None
    rss_mib: float | None = None
    error: str | None = None  # why the run stopped early, if it did


@dataclass(slots=True, frozen=True)
class ServerSummary:
    """A server's medians over its repeats."""

    server: str
    num_runs: int  # runs that reached the levels
    levels: list[LevelResult]
    long_prompt_ttft_s: dict[int, float | None]  # prompt tokens -> median TTFT
    startup_s: float | None = None  # medians over the runs
    rss_mib: float | None = None


@dataclass(slots=True, frozen=True)
class Ratio:
    """sluice's figure over a peer's, at one level or for one long-prompt length."""

    sluice: str
    peer: str
    concurrency: int | None  # None: a long prompt, whose TTFT ratio is in ttft_p50
    long_prompt_tokens: int | None  # that prompt's length; None at a level
    output_tokens_per_s: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    itl_p50: float | None
    itl_p90: float | None


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


# ---- medians and ratios --------------------------------------------------------------------

_LEVEL_METRICS = ("output_tokens_per_s", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s")


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _level_median(concurrency: int, results: list[LevelResult]) -> LevelResult:
    medians = {m: _median([getattr(r, m) for r in results]) for m in _LEVEL_METRICS}
    return LevelResult(
        concurrency=concurrency,
        num_requests=sum(r.num_requests for r in results),
        num_errors=sum(r.num_errors for r in results),
        first_error=next((r.first_error for r in results if r.first_error), None),
        **medians,
    )


def summarize(server: str, runs: list[ServerRun]) -> ServerSummary:
    """Each figure's median over the runs that have it."""
    measured = [r for r in runs if r.levels]
    by_level: dict[int, list[LevelResult]] = {}
    for run in measured:
        for level in run.levels or []:
            by_level.setdefault(level.concurrency, []).append(level)
    lengths = sorted({n for r in runs for n in r.long_prompt_ttft_s})
    return ServerSummary(
        server=server,
        num_runs=len(measured),
        levels=[_level_median(c, results) for c, results in by_level.items()],
        long_prompt_ttft_s={
            n: _median([r.long_prompt_ttft_s.get(n) for r in runs]) for n in lengths
        },
        startup_s=_median([r.startup_s for r in runs]),
        rss_mib=_median([r.rss_mib for r in measured]),
    )


def _over(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _level_ratios(sluice: ServerSummary, peer: ServerSummary) -> list[Ratio]:
    peer_levels = {level.concurrency: level for level in peer.levels}
    out = []
    for level in sluice.levels:
        other = peer_levels.get(level.concurrency)
        if other is not None:
            out.append(
                Ratio(
                    sluice.server,
                    peer.server,
                    level.concurrency,
                    None,
                    _over(level.output_tokens_per_s, other.output_tokens_per_s),
                    _over(level.ttft_p50_s, other.ttft_p50_s),
                    _over(level.ttft_p90_s, other.ttft_p90_s),
                    _over(level.itl_p50_s, other.itl_p50_s),
                    _over(level.itl_p90_s, other.itl_p90_s),
                )
            )
    return out


def ratios(summaries: list[ServerSummary], sluice_names: set[str]) -> list[Ratio]:
    """Every sluice variant over every peer, per level, then per long prompt's length."""
    out = []
    sluices = [s for s in summaries if s.server in sluice_names]
    peers = [s for s in summaries if s.server not in sluice_names]
    for sluice, peer in itertools.product(sluices, peers):
        out += _level_ratios(sluice, peer)
        for n, ttft_s in sorted(sluice.long_prompt_ttft_s.items()):
            long_ratio = _over(ttft_s, peer.long_prompt_ttft_s.get(n))
            out.append(Ratio(sluice.server, peer.server, None, n, None, long_ratio, *[None] * 3))
    return out


# ---- the table -----------------------------------------------------------------------------

_HEADER = ("C", "server", "tok/s", "TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "errors")


def format_number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def _level_rows(
    concurrency: int, summaries: list[ServerSummary], all_ratios: list[Ratio]
) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for summary in summaries:
        for level in summary.levels:
            if level.concurrency == concurrency:
                times = (level.ttft_p50_s, level.ttft_p90_s, level.itl_p50_s, level.itl_p90_s)
                errors = f"{level.num_errors}/{level.num_requests}"
                cells = (format_number(level.output_tokens_per_s), *map(format_ms, times), errors)
                rows.append((str(concurrency), summary.server, *cells))
    for ratio in all_ratios:
        if ratio.concurrency == concurrency:
            figures = (ratio.output_tokens_per_s, ratio.ttft_p50, ratio.ttft_p90)
            figures += (ratio.itl_p50, ratio.itl_p90)
            cells = tuple(format_number(v, 2) for v in figures)
            rows.append((str(concurrency), f"{ratio.sluice} / {ratio.peer}", *cells, ""))
    return rows


def table_rows(
    summaries: list[ServerSummary], all_ratios: list[Ratio], long_prompt_tokens: Sequence[int]
) -> list[tuple[str, ...]]:
    """Per level, then per long-prompt length: each server's figures, then each ratio."""
    rows: list[tuple[str, ...]] = []
    for concurrency in sorted({level.concurrency for s in summaries for level in s.levels}):
        rows += _level_rows(concurrency, summaries, all_ratios)
    for n in sorted(long_prompt_tokens):
        label = f"{n}-token prompt"
        for summary in summaries:
            ttft = format_ms(summary.long_prompt_ttft_s.get(n))
            rows.append((label, summary.server, "", ttft, "", "", "", ""))
        for ratio in all_ratios:
            if ratio.long_prompt_tokens == n:
                name = f"{ratio.sluice} / {ratio.peer}"
                rows.append((label, name, "", format_number(ratio.ttft_p50, 2), "", "", "", ""))
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


def footprint_table(summaries: list[ServerSummary]) -> str:
    """Each server's start-up time and resident memory (medians over its runs)."""
    lines = [
        "server | start-up s (to its first answer) | resident MiB (process group, after the levels)"
    ]
    for summary in summaries:
        lines.append(f"{summary.server} | {format_number(summary.startup_s)} | "
                     f"{format_number(summary.rss_mib, 0)}")  # fmt: skip
    return "\n".join(lines)
