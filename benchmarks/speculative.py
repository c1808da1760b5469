"""n-gram speculation served, side by side with llama.cpp's server (issue 29).

    .venv/bin/python benchmarks/speculative.py [--repeats 3] [--max-tokens 512] [--k K]
        [--ignore-eos]
        [--tasks code,json,quote,open] [--levels 16,64] [--level-max-tokens 128]
        [--llama-server PATH [--llama-gguf FILE]] [--out r.json] [--plot r.png]

Variants (each started, warmed up with `--warmup` short streams and one
prompt of random words, measured and stopped in turn; the order reverses
every other repeat, as in peers.py):
- `sluice off` and `sluice on`: `make serve`'s command (`sluice serve`) with
  SLUICE_SPEC_OFF, then as it is (speculation is on by default), or with
  `--k` drafted tokens at most when given;
- with `--llama-server`: llama-server on the embedded GGUF (the same 4-bit
  weights), one slot, every core, with no speculation (`llama.cpp off`) and
  with each `--spec-type` of LLAMA_SPEC_TYPES at its default n-gram sizes.
Tasks (_spec_tasks.py), one greedy stream each (chat, streamed, temperature
0, at most `--max-tokens`): code, json, quote (input-grounded) and open
(nothing to copy). A task's stream ends where the model ends its answer
(its end-of-sequence token), as a user's would; `--ignore-eos` runs every
stream to `--max-tokens` instead (what the model writes after its answer,
a new made-up chat turn with the 135M model, is then measured too). Per
task and variant: the decode rate (tokens after
the first over the time after the first token, median over repeats), its
ratio to the same server's rate with speculation off and to sluice off's on
the open task, the acceptance (sluice's /metrics counters; llama-server's
`timings.draft_n` / `draft_n_accepted`), and whether the text equals the
same server's with speculation off (greedy speculation is exact: it must).
Then, sluice only, off vs on: `--levels` of closed-loop streams of short
chat prompts (_load.py's, as peers.py runs them): output tok/s, TTFT, ITL.
The CPU's flags come first; JSON and, where matplotlib is installed, a PNG
go to `--out` / `--plot` (default: the log folder). Run it on a quiet
machine only: a shared machine's figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from _peer_files import _grouped_bars, has_matplotlib, machine_facts
from _peer_prompts import embedded_gguf, embedded_token_counter, random_word_prompt
from _peer_servers import llama_command, missing_binary, say, server_order, sluice_command
from _spec_measure import Variant, VariantRun, measure
from _spec_report import level_summaries, level_table, task_summaries, task_table
from _spec_tasks import TASKS, task_prompts
from peers import _exit_on_sigterm, _levels
from row_invariance import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
# sluice's serve flags for each side (speculation is on by default: the off
# side turns it off; the on side is the default command, or states k).
SLUICE_SPEC_OFF = "--speculative-config none"
SLUICE_SPEC_K = "--speculative-config " + shlex.quote(
    '{"method": "ngram", "num_speculative_tokens": {k}}'
)
LLAMA_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
WARMUP_PROMPT_TOKENS = 1000  # as long as the code task's material
LLAMA_CONTEXT_TOKENS = 2048  # a slot holds the longest task's prompt and template, plus the reply


def _tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise argparse.ArgumentTypeError(f"tasks are some of {','.join(TASKS)}: {text!r}")
    return tasks


def _levels_or_none(text: str) -> list[int]:
    return [] if text.strip() in ("", "0") else _levels(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="variant order alternates")
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens per task stream")
    parser.add_argument("--k", type=int, default=None, help="sluice's num_speculative_tokens")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="run task streams to --max-tokens"
    )
    parser.add_argument("--tasks", type=_tasks, default=list(TASKS), help="e.g. code,open")
    parser.add_argument(
        "--levels", type=_levels_or_none, default=[16, 64], help="streams, e.g. 16,64 (0: none)"
    )
    parser.add_argument("--warmup", type=int, default=4, help="warm-up streams (0: none)")
    parser.add_argument("--level-max-tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--requests-per-stream", type=int, default=2, help="C x this requests...")
    parser.add_argument("--min-requests", type=int, default=8, help="...and at least this many")
    parser.add_argument("--sluice-bin", type=Path, default=ROOT / ".venv" / "bin" / "sluice")
    parser.add_argument("--cache-dir", type=Path, default=None, help="sluice's model cache")
    parser.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary")
    parser.add_argument("--llama-gguf", type=Path, default=None, help="default: embedded GGUF")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--log-dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--out", type=Path, default=None, help="default: LOG_DIR/speculative.json")
    parser.add_argument("--plot", type=Path, default=None, help="default: LOG_DIR/speculative.png")
    return parser


def check_args(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot run, or None."""
    if (
        min(args.max_tokens, args.repeats, 1 if args.k is None else args.k, args.level_max_tokens)
        < 1
    ):
        return "--max-tokens, --repeats, --k and --level-max-tokens must be at least 1"
    if args.warmup < 0 or args.min_requests < 0:
        return "--warmup and --min-requests cannot be negative"
    return missing_binary(args.sluice_bin, args.llama_server)


def build_variants(args: argparse.Namespace, gguf: Path | None) -> list[Variant]:
    """sluice off and on; llama-server off and with each n-gram type, when given."""
    on_flags = "" if args.k is None else SLUICE_SPEC_K.replace("{k}", str(args.k))
    variants = [
        Variant("sluice off", "sluice", False, sluice_command(args.sluice_bin, SLUICE_SPEC_OFF)),
        Variant("sluice on", "sluice", True, sluice_command(args.sluice_bin, on_flags)),
    ]
    if args.llama_server is not None and gguf is not None:
        # Its libraries sit beside it (the build's RUNPATH may point elsewhere).
        environment = f"env LD_LIBRARY_PATH={shlex.quote(str(args.llama_server.parent))}"
        num_ctx_tokens = LLAMA_CONTEXT_TOKENS + args.max_tokens
        for spec_type in ("off", *LLAMA_SPEC_TYPES):
            flags = "" if spec_type == "off" else f"--spec-type {spec_type}"
            command = llama_command(args.llama_server, gguf, 1, num_ctx_tokens, flags)
            name = f"llama.cpp {spec_type}"
            variants.append(
                Variant(name, "llama.cpp", spec_type != "off", f"{environment} {command}")
            )
    return variants


def off_variants(variants: list[Variant]) -> dict[str, str]:
    """Each variant's family's variant with speculation off."""
    off = {v.family: v.name for v in variants if not v.is_speculative}
    return {v.name: off[v.family] for v in variants}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    print(f"CPU flags: {cpu_flags()}", flush=True)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="sluice-speculative-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    # 1. The variants, and the prompts counted by the embedded model's tokenizer.
    variants = build_variants(
        args, (args.llama_gguf or embedded_gguf()) if args.llama_server else None
    )
    count_tokens = embedded_token_counter(args.cache_dir)
    prompts = task_prompts(count_tokens, args.tasks)
    sizes = ", ".join(f"{task} {count_tokens(prompt)}" for task, prompt in prompts.items())
    say(
        f"variants: {', '.join(v.name for v in variants)}; prompt tokens: {sizes}; logs in {log_dir}"
    )
    # 2. One server at a time; the order reverses every other repeat.
    runs: list[VariantRun] = []
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        for repeat in range(args.repeats):
            for variant in server_order(variants, repeat):
                say(f"repeat {repeat + 1}/{args.repeats}: {variant.name}")
                seed = f"{variant.name}-{repeat}"  # text no other run or task shares
                warmup_prompt = random_word_prompt(count_tokens, WARMUP_PROMPT_TOKENS, seed)
                runs.append(measure(variant, repeat, args, prompts, warmup_prompt, log_dir))
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    # 3. Medians, ratios, the tables and the files.
    report(args, variants, runs, log_dir)
    return 0 if all(r.error is None for r in runs) else 1


def report(
    args: argparse.Namespace, variants: list[Variant], runs: list[VariantRun], log_dir: Path
) -> None:
    tasks = task_summaries(off_variants(variants), {
        v.name: [t for r in runs if r.variant == v.name for t in r.tasks] for v in variants})  # fmt: skip
    levels = level_summaries({
        v.name: [lv for r in runs if r.variant == v.name for lv in r.levels]
        for v in variants if v.family == "sluice"})  # fmt: skip
    print(task_table(tasks))
    print("decode tok/s: tokens after the first over the time after the first token; "
          "x own off: over the same server with speculation off; x sluice open: over "
          "sluice off on the open task")  # fmt: skip
    if levels:
        print(level_table(levels))
    for run in runs:
        if run.error:
            print(f"{run.variant}, repeat {run.repeat + 1}: {run.error}")
    out = args.out or log_dir / "speculative.json"
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out.write_text(json.dumps({
        "config": config, "machine": {**machine_facts(), "cpu_flags": cpu_flags()},
        "variants": [asdict(v) for v in variants], "runs": [asdict(r) for r in runs],
        "tasks": [asdict(s) for s in tasks], "levels": [asdict(s) for s in levels],
    }, indent=2))  # fmt: skip
    say(f"results: {out}")
    if has_matplotlib():
        plot = args.plot or log_dir / "speculative.png"
        write_png(plot, variants, tasks, levels)
        say(f"chart: {plot}")
    else:
        say("matplotlib is not installed in this venv: no chart")


def write_png(path: Path, variants: list[Variant], tasks: list, levels: list) -> None:
    """Grouped bars: decode tok/s per task and variant; tok/s per level, sluice off and on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.8), width_ratios=(3, 1))
    task_names = list(dict.fromkeys(s.task for s in tasks))
    rates = {(s.variant, s.task): s.decode_tok_s for s in tasks}
    bars = [SimpleNamespace(server=v.name) for v in variants]
    _grouped_bars(axes[0], bars, task_names, lambda b, t: rates.get((b.server, t)))
    axes[0].set_title("single stream decode tok/s")
    # Below the bars: inside, the legend covers the tallest.
    axes[0].legend(fontsize="small", ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    concurrencies = sorted({s.concurrency for s in levels})
    level_rates = {(s.variant, s.concurrency): s.output_tokens_per_s for s in levels}
    sluice_bars = [b for b in bars if b.server.startswith("sluice")]
    _grouped_bars(axes[1], sluice_bars, concurrencies, lambda b, c: level_rates.get((b.server, c)))
    axes[1].set_title("sluice output tok/s")
    axes[1].set_xlabel("concurrent streams")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
