"""sluice as `make serve` starts it, beside the peers installed here, on the same prompts.

    .venv/bin/python benchmarks/peers.py \\
        [--levels 1,16,64] [--max-tokens 128] [--repeats 1] [--long-prompt-tokens 3000,6000] \\
        [--sluice-flags '' --sluice-flags '--dtype bfloat16' ...] \\
        [--vllm-venv /work/peers/vllm | --no-vllm] [--vllm-model HF_FOLDER] [--vllm-flags ...] \\
        [--llama-server PATH [--llama-gguf FILE] [--llama-flags ...]] [--out r.json] [--plot r.png]

Servers (see docs/BENCHMARKS.md, "Peers", for installing them; _peer_servers.py):
- sluice: `.venv/bin/sluice serve --host 127.0.0.1 --port PORT`, the command of
  `make serve`, no other flag; each `--sluice-flags` adds a variant with those
  flags (`''` is the default command; the first given is listed first).
- vLLM's CPU build, when `--vllm-venv` holds one: its OpenAI server on the HF
  folder that sluice converts the embedded model into (bf16, vLLM's default
  for a float32 checkpoint), both cores (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`).
- llama.cpp's `llama-server`, when `--llama-server` names one: the embedded
  GGUF itself, one slot per stream of the highest level, each slot as long as
  the longest long prompt plus its reply, every core.

One server runs at a time (they would share the cores): for each repeat, each
server in turn is started on a free port, waited for, warmed up (short
streams, then one long prompt of other text, as long as the longest),
measured, and stopped with its whole process group; the order reverses every
other repeat, and the report gives each figure's median over the repeats.
Measured per server (_peer_measure.py):
- alone on the idle server, for each length of `--long-prompt-tokens`
  (default 3000,6000; `0` or `''`: none), shortest first: the TTFT of one
  prompt of that many tokens (counted by the embedded model's tokenizer,
  before the chat template), lines of random words new to the server: each
  length, repeat and server gets its own text (_peer_prompts.py), so nothing
  of it is in any cache;
- for each level C: C closed-loop streams (each sends its next request when
  the last ends) of `--max-tokens`-token chat completions, `ignore_eos`,
  temperature 0, the prompts of _load.py: output tokens/s, TTFT p50/p90, ITL
  p50/p90 (definitions in _load.py);
- its start-up time (from starting the process to its first answer) and the
  resident memory of its whole process group after the last level.

The table gives one row per server and level, then per long-prompt length,
and below the peers' rows a row `sluice / PEER` with each figure's ratio:
above 1 for tokens/s and below 1 for times mean sluice is better
(_peer_report.py). JSON (a long prompt's TTFT is a dict length -> seconds)
and, where matplotlib is installed, a PNG bar chart go to `--out` and
`--plot`, by default into the log folder (_peer_files.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from _peer_files import has_matplotlib, package_version, results_json, write_png
from _peer_measure import measure
from _peer_prompts import embedded_gguf, embedded_hf_folder, embedded_token_counter, long_prompts
from _peer_report import (
    ServerRun,
    footprint_table,
    format_table,
    ratios,
    summarize,
    table_rows,
)
from _peer_servers import (
    DEFAULT_VLLM_VENV,
    Server,
    build_servers,
    missing_binary,
    say,
    server_order,
    sluice_name,
)

ROOT = Path(__file__).resolve().parents[1]


# ---- command line --------------------------------------------------------------------------


def _levels(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"levels are integers, e.g. 1,16,64: {text!r}") from error
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"levels are positive integers: {text!r}")
    return levels


def _lengths(text: str) -> list[int]:
    """Long-prompt lengths in tokens, shortest first; `0` or `''` is none."""
    if text.strip() in ("", "0"):
        return []
    try:
        lengths = [int(c) for c in text.split(",") if c.strip()]
    except ValueError as error:
        message = f"long-prompt lengths are integers, e.g. 3000,6000: {text!r}"
        raise argparse.ArgumentTypeError(message) from error
    if not lengths or min(lengths) < 1:
        message = f"long-prompt lengths are positive integers (`0` alone: none): {text!r}"
        raise argparse.ArgumentTypeError(message)
    return sorted(set(lengths))


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
        "--long-prompt-tokens",
        type=_lengths,
        default=[3000, 6000],
        metavar="N,N",
        help="a fresh prompt's TTFT at each length, e.g. 3000,6000 (0: none)",
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
    if args.warmup < 0 or args.min_requests < 0:
        return "--warmup and --min-requests cannot be negative"
    names = [sluice_name(flags) for flags in (args.sluice_flags or [""])]
    if len(set(names)) != len(names):
        return "two --sluice-flags give the same variant"
    return missing_binary(args.sluice_bin, args.llama_server)


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
    # 1. The servers that are installed, and the tokenizer that counts long prompts.
    has_vllm = find_vllm(args)
    vllm_model = (args.vllm_model or embedded_hf_folder(args.cache_dir)) if has_vllm else None
    gguf = (args.llama_gguf or embedded_gguf()) if args.llama_server else None
    servers = build_servers(args, vllm_model, gguf)
    count_tokens = embedded_token_counter(args.cache_dir) if args.long_prompt_tokens else len
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
                prompts = long_prompts(count_tokens, args.long_prompt_tokens, server.name, repeat)
                runs.append(measure(server, repeat, args, prompts, log_dir))
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    # 3. Medians, ratios, the table and the files.
    report(args, servers, versions, runs, log_dir)
    return 0 if all(r.error is None for r in runs) else 1


def report(
    args: argparse.Namespace,
    servers: list[Server],
    versions: dict,
    runs: list[ServerRun],
    log_dir: Path,
) -> None:
    """Print the table and the runs' errors; write the JSON and, if it can, the PNG."""
    summaries = [summarize(s.name, [r for r in runs if r.server == s.name]) for s in servers]
    all_ratios = ratios(summaries, {s.name for s in servers if s.is_sluice})
    print(format_table(table_rows(summaries, all_ratios, args.long_prompt_tokens)))
    print(footprint_table(summaries))
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


if __name__ == "__main__":
    sys.exit(main())
