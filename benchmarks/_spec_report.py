"""What speculative.py measured, and its report: rates, ratios, acceptance, the tables.

A task's decode rate is the tokens after the first content chunk's over the
time from that chunk to the last (a request's, then the median over
repeats). Its ratios: over the same server's rate with speculation off on
the same task, and over sluice's rate (speculation off) on the open-ended
task. Acceptance is accepted over drafted tokens, summed over repeats.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from _load import RequestRecord
from _peer_report import LevelResult, format_ms, format_number

DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
OPEN_TASK = "open"
SLUICE_OFF = "sluice off"


@dataclass(slots=True)
class TaskRun:
    """One task's single stream on one server start."""

    task: str
    decode_tok_s: float | None  # None: fewer than two content chunks
    num_tokens: int
    num_drafted: int | None  # None: the server says nothing of drafts (speculation off)
    num_accepted: int | None
    text: str
    error: str | None


@dataclass(slots=True)
class SpecLevel:
    """One level of closed-loop streams, and what sluice drafted meanwhile."""

    result: LevelResult
    num_drafted: int
    num_accepted: int


@dataclass(slots=True, frozen=True)
class TaskSummary:
    variant: str
    task: str
    decode_tok_s: float | None  # median over repeats
    vs_off: float | None  # over the same server's speculation-off rate on this task
    vs_sluice_open: float | None  # over sluice off's rate on the open-ended task
    acceptance: float | None  # accepted / drafted, over all repeats
    same_text_as_off: bool | None  # None: no off text to compare (or this is off)


@dataclass(slots=True, frozen=True)
class LevelSummary:
    variant: str
    concurrency: int
    output_tokens_per_s: float | None  # median over repeats
    vs_off: float | None  # over sluice off's at this level
    ttft_p50_s: float | None
    itl_p50_s: float | None
    acceptance: float | None
    num_errors: int


def decode_tok_s(record: RequestRecord) -> float | None:
    """Tokens after the first content chunk over the time after it."""
    arrivals = record.chunk_arrivals_s
    if len(arrivals) < 2 or arrivals[-1] <= arrivals[0]:
        return None
    return (record.num_output_tokens - record.chunk_num_tokens[0]) / (arrivals[-1] - arrivals[0])


def spec_counters(metrics_text: str) -> tuple[int, int]:
    """(drafted, accepted) tokens from Prometheus text: sluice's vLLM-named counters."""
    values = {DRAFTED: 0.0, ACCEPTED: 0.0}
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return int(values[DRAFTED]), int(values[ACCEPTED])


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _over(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def acceptance(pairs: list[tuple[int | None, int | None]]) -> float | None:
    """Accepted over drafted, summed over (drafted, accepted) pairs; None if nothing drafted."""
    drafted = sum(d for d, _ in pairs if d is not None)
    accepted = sum(a for d, a in pairs if d is not None and a is not None)
    return accepted / drafted if drafted else None


def _same_text(texts: list[str], off_texts: list[str]) -> bool | None:
    if not texts or not off_texts:
        return None
    return len(set(off_texts)) == 1 and all(text == off_texts[0] for text in texts)


def task_summaries(
    off_of: dict[str, str], runs_by_variant: dict[str, list[TaskRun]]
) -> list[TaskSummary]:
    """One summary per variant and task; `off_of` maps a variant to its family's off variant."""
    rate = {
        (variant, task): _median([r.decode_tok_s for r in runs if r.task == task and not r.error])
        for variant, runs in runs_by_variant.items()
        for task in {r.task for r in runs}
    }
    summaries = []
    for variant, runs in runs_by_variant.items():
        off = off_of[variant]
        for task in dict.fromkeys(r.task for r in runs):
            mine = [r for r in runs if r.task == task and not r.error]
            off_texts = [r.text for r in runs_by_variant.get(off, []) if r.task == task]
            summaries.append(TaskSummary(
                variant=variant,
                task=task,
                decode_tok_s=rate[(variant, task)],
                vs_off=_over(rate[(variant, task)], rate.get((off, task))),
                vs_sluice_open=_over(rate[(variant, task)], rate.get((SLUICE_OFF, OPEN_TASK))),
                acceptance=acceptance([(r.num_drafted, r.num_accepted) for r in mine]),
                same_text_as_off=None if off == variant else _same_text(
                    [r.text for r in mine], off_texts),
            ))  # fmt: skip
    return summaries


def level_summaries(levels_by_variant: dict[str, list[SpecLevel]]) -> list[LevelSummary]:
    """One summary per sluice variant and level; ratios over sluice off's."""
    rate = {
        (variant, c): _median([lv.result.output_tokens_per_s for lv in levels
                               if lv.result.concurrency == c])
        for variant, levels in levels_by_variant.items()
        for c in {lv.result.concurrency for lv in levels}
    }  # fmt: skip
    summaries = []
    for (variant, concurrency), tokens_per_s in rate.items():
        mine = [lv for lv in levels_by_variant[variant] if lv.result.concurrency == concurrency]
        summaries.append(LevelSummary(
            variant=variant,
            concurrency=concurrency,
            output_tokens_per_s=tokens_per_s,
            vs_off=_over(tokens_per_s, rate.get((SLUICE_OFF, concurrency))),
            ttft_p50_s=_median([lv.result.ttft_p50_s for lv in mine]),
            itl_p50_s=_median([lv.result.itl_p50_s for lv in mine]),
            acceptance=acceptance([(lv.num_drafted, lv.num_accepted) for lv in mine]),
            num_errors=sum(lv.result.num_errors for lv in mine),
        ))  # fmt: skip
    return sorted(summaries, key=lambda s: (s.concurrency, s.variant))


# ---- the tables -------------------------------------------------------------------------------


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Columns aligned; the first two left-aligned, figures right-aligned."""
    all_rows = [header, *rows]
    widths = [max(len(row[i]) for row in all_rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in all_rows
    )


def task_table(summaries: list[TaskSummary]) -> str:
    header = ("task", "server", "decode tok/s", "x own off", "x sluice open", "accepted",
              "same text as off")  # fmt: skip
    same = {True: "yes", False: "NO", None: "-"}
    rows = [
        (s.task, s.variant, format_number(s.decode_tok_s), format_number(s.vs_off, 2),
         format_number(s.vs_sluice_open, 2), _percent(s.acceptance), same[s.same_text_as_off])
        for s in sorted(summaries, key=lambda s: s.task)
    ]  # fmt: skip
    return aligned(header, rows)


def level_table(summaries: list[LevelSummary]) -> str:
    header = ("streams", "server", "tok/s", "x off", "TTFT p50 ms", "ITL p50 ms", "accepted",
              "errors")  # fmt: skip
    rows = [
        (str(s.concurrency), s.variant, format_number(s.output_tokens_per_s),
         format_number(s.vs_off, 2), format_ms(s.ttft_p50_s), format_ms(s.itl_p50_s),
         _percent(s.acceptance), str(s.num_errors))
        for s in summaries
    ]  # fmt: skip
    return aligned(header, rows)
