"""peers.py's files: the JSON of every run, median and ratio, and the PNG bar chart.

In the JSON a long prompt's TTFT is a dict from its length in tokens (a
string key, as JSON has no others) to seconds. The PNG is drawn only where
matplotlib is installed; it is not a sluice dependency.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from _peer_report import Ratio, ServerRun, ServerSummary
from _peer_servers import Server


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


def _grouped_bars(
    axis,
    summaries: list[ServerSummary],
    groups: list[int],
    height_of: Callable[[ServerSummary, int], float | None],
) -> None:
    """One group of bars per entry of `groups`, one bar per server, in the servers' colours."""
    width = 0.8 / max(len(summaries), 1)
    for index, summary in enumerate(summaries):
        heights = [height_of(summary, group) or 0.0 for group in groups]
        xs = [i + (index - (len(summaries) - 1) / 2) * width for i in range(len(groups))]
        axis.bar(xs, heights, width, label=summary.server, color=f"C{index}")
    axis.set_xticks(range(len(groups)), [str(group) for group in groups])


def write_png(path: Path, summaries: list[ServerSummary], long_prompt_tokens: list[int]) -> None:
    """Grouped bars per level: tokens/s, TTFT p50, ITL p50; per length: the long prompts' TTFT."""
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
    for axis, (title, metric, scale) in zip(axes, panels, strict=False):

        def level_height(summary: ServerSummary, concurrency: int, metric=metric, scale=scale):
            by_level = {level.concurrency: getattr(level, metric) for level in summary.levels}
            value = by_level.get(concurrency)
            return None if value is None else value * scale

        _grouped_bars(axis, summaries, levels, level_height)
        axis.set_xlabel("concurrent streams")
        axis.set_title(title)
    if long_prompt_tokens:
        lengths = sorted(long_prompt_tokens)
        _grouped_bars(axes[3], summaries, lengths, lambda s, n: s.long_prompt_ttft_s.get(n))
        axes[3].set_xlabel("prompt tokens, nothing cached")
        axes[3].set_title("long prompt TTFT (s)")
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
