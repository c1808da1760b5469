"""`sluice audit`: check any OpenAI-compatible server for broken streams, and
measure it. Exit status: 0 when every invariant held, 1 when one broke, 2 for
a usage error or an unreachable server, 3 when none broke but a check could
not be exercised (no stream merged under backpressure, abort not verifiable).

    sluice audit --base-url http://127.0.0.1:8000 --model NAME [--profile quick|full]
        [--scenarios lag,stops,...] [--<scenario>-<size> N ...] [--json out.json]
        [--html out.html] [--compare URL_A URL_B]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import fields
from pathlib import Path

from sluice.audit.options import (
    EXTENSION_MODES,
    PROFILE_SCENARIOS,
    PROFILES,
    SCENARIO_NAMES,
    AuditOptions,
    Sizes,
    with_overrides,
)
from sluice.audit.progress import Progress
from sluice.audit.records import AuditResult, Target
from sluice.audit.report_html import write_html
from sluice.audit.report_json import write_json
from sluice.audit.report_text import render_text
from sluice.audit.runner import preflight, run_audit
from sluice.audit.summary import summarize_audit

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A command line that cannot run; the message says why."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice audit",
        description="Check an OpenAI-compatible server for broken streams, and measure it.",
    )
    parser.add_argument("--base-url", help="server to audit, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="model name sent in every request")
    parser.add_argument("--api-key", help="sent as a Bearer token")
    parser.add_argument(
        "--compare", nargs=2, metavar=("URL_A", "URL_B"), help="audit two servers side by side"
    )
    parser.add_argument("--model-b", help="compare mode: model name on server B (default: --model)")
    parser.add_argument(
        "--api-key-b", help="compare mode: API key for server B (default: --api-key)"
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument(
        "--scenarios", help=f"comma-separated subset of: {', '.join(SCENARIO_NAMES)}"
    )
    parser.add_argument(
        "--vllm-extensions",
        choices=EXTENSION_MODES,
        default="auto",
        help="vLLM extensions (continuous_usage_stats, include_stop_str_in_output, min_tokens, "
        "ignore_eos...): auto probes each and sends those the server supports (default)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="also hold the server to sluice's strict rules (no empty chunks, no SSE comment "
        "lines, param in every error object)",
    )
    parser.add_argument(
        "--request-timeout-s", type=float, default=120.0, help="seconds without a byte"
    )
    parser.add_argument("--json", type=Path, help="write the machine-readable report here")
    parser.add_argument("--html", type=Path, help="write the self-contained HTML report here")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    _add_size_flags(parser)
    return parser


def _add_size_flags(parser: argparse.ArgumentParser) -> None:
    quick, full = PROFILES["quick"], PROFILES["full"]
    for scenario in SCENARIO_NAMES:
        group = parser.add_argument_group(f"{scenario} scenario sizes")
        for field in fields(getattr(quick, scenario)):
            quick_value = getattr(getattr(quick, scenario), field.name)
            full_value = getattr(getattr(full, scenario), field.name)
            group.add_argument(
                f"--{scenario}-{field.name}".replace("_", "-"),
                dest=f"size__{scenario}__{field.name}",
                type=type(quick_value),
                default=None,
                help=f"{field.metadata['help']} (quick {quick_value}, full {full_value})",
            )


def _normalise_url(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


def targets_from(args: argparse.Namespace) -> list[Target]:
    if args.compare and args.base_url:
        raise UsageError("give either --base-url or --compare URL_A URL_B, not both")
    if args.compare:
        url_a, url_b = args.compare
        return [
            Target("A", _normalise_url(url_a), args.model, args.api_key),
            Target(
                "B",
                _normalise_url(url_b),
                args.model_b or args.model,
                args.api_key_b or args.api_key,
            ),
        ]
    if not args.base_url:
        raise UsageError("--base-url (or --compare URL_A URL_B) is required")
    return [Target("server", _normalise_url(args.base_url), args.model, args.api_key)]


def options_from(args: argparse.Namespace) -> AuditOptions:
    scenarios = PROFILE_SCENARIOS[args.profile]
    if args.scenarios:
        scenarios = tuple(
            name.strip().replace("-", "_") for name in args.scenarios.split(",") if name.strip()
        )
        unknown = [name for name in scenarios if name not in SCENARIO_NAMES]
        if unknown or not scenarios:
            raise UsageError(
                f"unknown scenarios {unknown}; choose from {', '.join(SCENARIO_NAMES)}"
            )
    return AuditOptions(
        profile=args.profile,
        scenarios=scenarios,
        sizes=_sizes_from(args, PROFILES[args.profile]),
        vllm_extensions=args.vllm_extensions,
        strict=args.strict,
        request_timeout_s=args.request_timeout_s,
    )


def _sizes_from(args: argparse.Namespace, base: Sizes) -> Sizes:
    overrides: dict[str, dict[str, object]] = {}
    for key, value in vars(args).items():
        if key.startswith("size__") and value is not None:
            _, scenario, name = key.split("__")
            if isinstance(value, int | float) and value < 0:
                raise UsageError(f"--{scenario}-{name} must not be negative".replace("_", "-"))
            overrides.setdefault(scenario, {})[name] = value
    return with_overrides(base, overrides)


async def _audit(
    targets: list[Target], options: AuditOptions, progress: Progress | None
) -> AuditResult:
    check = await preflight(targets)
    for warning in check.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if check.errors:
        raise UsageError("; ".join(check.errors))
    if progress is not None:
        progress.start()
    try:
        return await run_audit(targets, options, progress)
    finally:
        if progress is not None:
            await progress.stop()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # --help (0) or an argparse error (2)
        return int(exit_request.code or 0)
    try:
        targets, options = targets_from(args), options_from(args)
        progress = None if args.quiet else Progress(sys.stdout, is_tty=sys.stdout.isatty())
        result = asyncio.run(_audit(targets, options, progress))
    except UsageError as error:
        print(f"sluice audit: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nsluice audit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    summary = summarize_audit(result)
    sys.stdout.write(render_text(result, summary))
    if args.json:
        write_json(result, summary, args.json)
    if args.html:
        write_html(result, summary, args.html)
    return summary.exit_status
