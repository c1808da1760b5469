"""Single-stream decode speed with n-gram speculation on and off (issue 29).

    .venv/bin/python benchmarks/speculative.py [--repeats 3] [--max-tokens 512]
        [--k 4] [--min-n 2] [--max-n 4] [--threads N] [--tasks copy,open]

Loads the embedded model once (default settings) and builds two engine cores
on it in this process, one without speculation and one with
`{"method": "ngram", "num_speculative_tokens": k, ...}`. Each task is one
greedy stream, run on both cores in turn, alternating which goes first
(repeat r runs off-then-on when r is even, on-then-off when odd), so drift
of a shared machine lands on both sides:
- copy: an input-grounded task: a ~1,000-token source text (the start of
  sluice/engine/kv_cache.py) to repeat with one identifier renamed;
- open: open-ended text with nothing to copy.
Per task and side it prints the median decode rate (tokens after the first,
over the time after the first token), the acceptance rate (accepted /
drafted tokens) and the tokens per step, then the speed-up; it also says
whether both sides produced the same tokens (greedy: they should; in
bfloat16 a multi-token step rounds differently, which may flip a near tie).

Run it on a quiet machine only: the figures of a shared one mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.config import CacheConfig, EngineConfig, ModelConfig, SpeculativeConfig
from sluice.engine.core import EngineCore
from sluice.engine.sampling_params import SamplingParams
from sluice.loader import load_model

SOURCE = Path(__file__).resolve().parents[1] / "sluice" / "engine" / "kv_cache.py"
COPY_TOKENS = 1000
OPEN_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


@dataclass(slots=True)
class Run:
    decode_tok_s: float
    num_tokens: int
    num_steps: int
    num_drafted: int
    num_accepted: int
    token_ids: list[int]


def copy_prompt(tokenizer) -> str:
    """About COPY_TOKENS tokens of source to repeat with one change."""
    lines, text = SOURCE.read_text().splitlines(keepends=True), ""
    for line in lines:
        if len(tokenizer.encode(text)) >= COPY_TOKENS:
            break
        text += line
    return (
        "Repeat the following Python code exactly, character for character, but rename "
        "`num_blocks` to `block_count` everywhere. Output only the code.\n\n" + text
    )


def chat_ids(tokenizer, content: str) -> list[int]:
    if tokenizer.has_chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": content}])
        return tokenizer.encode(text)
    return tokenizer.encode(content, add_special_tokens=True)


def run_one(core: EngineCore, prompt_ids: list[int], params: SamplingParams, name: str) -> Run:
    counters = core.speculator.counters if core.speculator is not None else None
    drafted0 = counters.num_draft_tokens if counters else 0
    accepted0 = counters.num_accepted_tokens if counters else 0
    core.add_request(name, prompt_ids, params)
    token_ids: list[int] = []
    first_s = end_s = 0.0
    num_first = num_steps = 0
    while core.has_unfinished_requests():
        deltas = core.step()
        now = time.perf_counter()
        for delta in deltas:
            if delta.new_token_ids and not token_ids:
                first_s, num_first = now, len(delta.new_token_ids)
            elif delta.new_token_ids:
                num_steps += 1
            token_ids.extend(delta.new_token_ids)
        end_s = now
    num_after_first = len(token_ids) - num_first
    return Run(
        decode_tok_s=num_after_first / max(end_s - first_s, 1e-9),
        num_tokens=len(token_ids),
        num_steps=num_steps,
        num_drafted=(counters.num_draft_tokens - drafted0) if counters else 0,
        num_accepted=(counters.num_accepted_tokens - accepted0) if counters else 0,
        token_ids=token_ids,
    )


def summary(task: str, off: list[Run], on: list[Run]) -> str:
    """One task's line: medians off and on, acceptance, tokens per step, speed-up."""
    rate_off = statistics.median(r.decode_tok_s for r in off)
    rate_on = statistics.median(r.decode_tok_s for r in on)
    drafted = sum(r.num_drafted for r in on)
    accepted = sum(r.num_accepted for r in on)
    acceptance = f"{accepted / drafted:.0%}" if drafted else "n/a"
    per_step = sum(r.num_tokens for r in on) / max(1, sum(r.num_steps + 1 for r in on))
    same = all(a.token_ids == b.token_ids for a, b in zip(off, on, strict=True))
    return (
        f"{task:<6} off {rate_off:7.1f} tok/s  on {rate_on:7.1f} tok/s  "
        f"x{rate_on / rate_off:.2f}  acceptance {acceptance} ({accepted}/{drafted})  "
        f"{per_step:.2f} tokens/step  same tokens: {'yes' if same else 'NO'}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--min-n", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--max-n", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tasks", default="copy,open")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    loaded = load_model(ModelConfig())
    speculative = SpeculativeConfig(
        num_speculative_tokens=args.k, prompt_lookup_min=args.min_n, prompt_lookup_max=args.max_n
    )
    cores = {
        side: EngineCore(
            EngineConfig(
                cache=CacheConfig(kv_cache_memory_bytes=256 << 20),
                multiprocess=False,
                num_threads=args.threads,
                speculative_config=speculative if side == "on" else None,
            ),
            loaded=loaded,
        )
        for side in ("off", "on")
    }
    prompts = {
        "copy": chat_ids(loaded.tokenizer, copy_prompt(loaded.tokenizer)),
        "open": chat_ids(loaded.tokenizer, OPEN_PROMPT),
    }
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    tasks = [task for task in args.tasks.split(",") if task]
    print(f"model {loaded.name}; k={args.k}, n {args.min_n}..{args.max_n}; "
          f"prompts: " + ", ".join(f"{t} {len(prompts[t])} tokens" for t in tasks))  # fmt: skip
    runs: dict[tuple[str, str], list[Run]] = {}
    for repeat in range(args.repeats):
        for task in tasks:
            for side in ("off", "on") if repeat % 2 == 0 else ("on", "off"):
                run = run_one(cores[side], prompts[task], params, f"{task}-{side}-{repeat}")
                runs.setdefault((task, side), []).append(run)
                print(f"  {task} {side}: {run.decode_tok_s:.1f} tok/s, {run.num_tokens} tokens")
    for task in tasks:
        print(summary(task, runs[(task, "off")], runs[(task, "on")]))


if __name__ == "__main__":
    main()
