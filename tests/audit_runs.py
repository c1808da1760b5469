"""`sluice audit`'s quick profile run in-process against a served model, at
sizes small enough for a loaded 2-core CPU (a few tokens/s per stream).

Shared by the end-to-end audit tests (test modules never import one another).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.audit.cli import main as audit_main

# The quick profile's shape, smaller numbers: a few streams, 4-12 tokens each.
CI_SIZES: dict[str, dict[str, float]] = {
    # Long enough that every paused stream but Messages' outgrows sluice's
    # buffers (about 200 KB: a 64 KiB SO_SNDBUF, doubled, and the transport's
    # 64 KiB); the paused readers wait for their controls to end, however
    # loaded the machine (the server's --send-timeout is raised to match).
    "backpressure": {"max_tokens": 192, "n": 2, "top": 20, "pause_s": 240},
    "lag": {"streams": 4, "slow_share": 0.5, "max_tokens": 10, "long_prompts": 1,
            "long_prompt_words": 300},
    "logprobs": {"requests": 1, "top": 2, "max_tokens": 6},
    "choices": {"n": 2, "prompts": 2, "max_tokens": 6},
    # Four cases: spanning, first chunk, overlapping, several at once.
    "stops": {"max_tokens": 10, "cases": 4},
    "utf8": {"requests": 1, "max_tokens": 12},
    "usage": {"max_tokens": 4},
    "bad_inputs": {"repeat": 1},
    # The running-requests gauge in /metrics is the sharper detector here: the
    # probe's latency on a CPU hardly grows with two more sequences in the batch.
    "disconnect": {"streams": 2, "max_tokens": 256, "probes": 3, "probe_tokens": 4},
    "responses": {"max_tokens": 8, "truncated_tokens": 3, "tool_max_tokens": 48},
    "messages": {"max_tokens": 8, "truncated_tokens": 3, "tool_max_tokens": 48},
}  # fmt: skip


# `sluice serve` flags for an audited server: a paused reader is not cut
# before its control stream ends (the default --send-timeout is 30 s).
PATIENT_SERVE_FLAGS = ("--send-timeout", "300")


@dataclass(frozen=True, slots=True)
class AuditRun:
    exit_status: int
    elapsed_s: float
    report: dict[str, Any]
    html: str
    # The text summary the audit printed, shown when an assertion fails.
    text: str


def size_flags(sizes: dict[str, dict[str, float]]) -> list[str]:
    """`--<scenario>-<field> value` for each size, as `sluice audit` spells them."""
    flags = []
    for scenario, values in sizes.items():
        for name, value in values.items():
            flags += [f"--{scenario}-{name}".replace("_", "-"), str(value)]
    return flags


def run_quick_audit(base_url: str, model: str, out: Path, *extra: str) -> AuditRun:
    """The quick profile at `CI_SIZES` (`extra`: more audit flags); its JSON
    and HTML reports are written under `out`."""
    argv = [
        "--base-url", base_url, "--model", model,
        "--profile", "quick", "--quiet", "--request-timeout-s", "60",
        "--json", str(out / "audit.json"), "--html", str(out / "audit.html"),
        *size_flags(CI_SIZES), *extra,
    ]  # fmt: skip
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        exit_status = audit_main(argv)
    elapsed_s = time.monotonic() - started
    text = stdout.getvalue()
    print(f"\nsluice audit quick (CI sizes) took {elapsed_s:.1f}s\n{text}")
    report = json.loads((out / "audit.json").read_text(encoding="utf-8"))
    html = (out / "audit.html").read_text(encoding="utf-8")
    return AuditRun(exit_status, elapsed_s, report, html, text)
