"""What structured outputs cost per engine step, at batch 1 and 16, with the default settings.

    .venv/bin/python benchmarks/structured.py [--batches 1,16] [--steps 24] [--rounds 3] [--threads N]

Runs the engine core in this process (as step_profile.py does) and times
decode steps of a full batch in three variants, alternated round by round so
that load from elsewhere on the machine falls on all of them alike:
- free: greedy requests without a constraint;
- schema: the same requests under a JSON schema whose one string must be at
  least 2,000 characters long, so every timed step is inside a JSON string,
  where nearly the whole vocabulary is allowed (the largest masks);
- half: half the batch under the schema, half free.
Prints the median step time per variant, its ratio to free, and the grammar's
own share of a step: the mask (llguidance filling the bitmask of the
constrained rows, unpacked into the batch's [B, V] mask; the masked_fill_ that
applies it runs inside the sampler, untimed here) and advancing the matchers.
Then the cost a free batch pays for the feature at all: the check that finds
no constrained row, timed alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

import sluice.engine.sampling.batch as sampling_batch
from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling.batch import SamplingRow
from sluice.engine.sampling_params import SamplingParams
from sluice.structured.matcher import GrammarMatcher
from sluice.structured.spec import StructuredOutputSpec

PROMPT = "Write a long story about a lighthouse keeper and the sea, as JSON."
SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 2000}},
    "required": ["story"],
}
VARIANTS = ("free", "schema", "half")


class Timers:
    """Wall time per named function, summed per step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return timed


def install_timers(timers: Timers) -> None:
    sampling_batch.forbidden_tokens = timers.wrap("mask", sampling_batch.forbidden_tokens)
    GrammarMatcher.accept = timers.wrap("matcher advance", GrammarMatcher.accept)


def run_variant(core: EngineCore, prompt: list[int], batch: int, variant: str, steps: int):
    """Median step time (s) of `steps` full-batch decode steps, and the grammar's ms/step."""
    free = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
    constrained = SamplingParams(
        max_tokens=100_000,
        temperature=0.0,
        ignore_eos=True,
        structured_output=StructuredOutputSpec.json_schema(SCHEMA),
    )
    num_constrained = {"free": 0, "schema": batch, "half": batch // 2}[variant]
    ids = [f"{variant}-{i}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        core.add_request(
            generation_request(request_id, prompt, constrained if i < num_constrained else free)
        )
    while len(core.awaiting_grammar):  # a new grammar compiles off the loop first
        core.step()
    for _ in range(4):  # prefill, the opening `{"story": "`, then decoding
        core.step()
    timers = Timers()
    install_timers(timers)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        deltas = core.step()
        times.append(time.perf_counter() - start)
        assert len(deltas) == batch and not any(d.finish_reason for d in deltas), "batch changed"
    uninstall_timers()
    core.abort_requests(ids)
    while core.has_unfinished_requests():
        core.step()
    return statistics.median(times), {k: v / steps * 1e3 for k, v in timers.seconds.items()}


_ORIGINALS = (sampling_batch.forbidden_tokens, GrammarMatcher.accept)


def uninstall_timers() -> None:
    sampling_batch.forbidden_tokens, GrammarMatcher.accept = _ORIGINALS


def free_check_us(batch: int, repeats: int = 20_000) -> float:
    """Microseconds a free batch spends finding that no row is constrained."""
    params = SamplingParams(temperature=0.0)
    rows = [SamplingRow(f"r{i}", params, [1, 2, 3], []) for i in range(batch)]
    start = time.perf_counter()
    for _ in range(repeats):
        sampling_batch._forbidden_tokens(rows, 49152, torch.device("cpu"))
        sampling_batch.is_plain_greedy(rows)
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (engine default)")
    args = parser.parse_args()
    config = EngineConfig(model=ModelConfig(), multiprocess=False, num_threads=args.threads)
    core = EngineCore(config)
    print(f"model: {core.loaded.choices}; torch threads {torch.get_num_threads()}")
    prompt = core.loaded.tokenizer.encode(PROMPT)
    run_variant(core, prompt, 1, "schema", 2)  # warm-up: llguidance tokenizer, grammar cache
    for batch in [int(b) for b in args.batches.split(",")]:
        report(core, prompt, batch, args.steps, args.rounds)


def report(core: EngineCore, prompt: list[int], batch: int, steps: int, rounds: int) -> None:
    step_s: dict[str, list[float]] = defaultdict(list)
    grammar_ms: dict[str, list[dict[str, float]]] = defaultdict(list)
    for _ in range(rounds):
        for variant in VARIANTS:
            if variant == "half" and batch < 2:
                continue
            median_s, parts = run_variant(core, prompt, batch, variant, steps)
            step_s[variant].append(median_s)
            grammar_ms[variant].append(parts)
    print(f"\n== batch {batch} ({rounds} rounds x {steps} steps, median per round)")
    free_ms = statistics.median(step_s["free"]) * 1e3
    for variant, values in step_s.items():
        ms = statistics.median(values) * 1e3
        ratios = ", ".join(
            f"{v * 1e3 / (f * 1e3):.3f}" for v, f in zip(values, step_s["free"], strict=True)
        )
        parts = _median_parts(grammar_ms[variant])
        detail = ", ".join(f"{name} {value:.2f} ms" for name, value in parts.items())
        print(f"  {variant:<7} {ms:7.2f} ms/step  x{ms / free_ms:.3f} (rounds: {ratios})  {detail}")
    print(f"  a free batch's check for constrained rows: {free_check_us(batch):.2f} us/step")


def _median_parts(rounds: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({name for parts in rounds for name in parts})
    return {name: statistics.median(parts.get(name, 0.0) for parts in rounds) for name in names}


if __name__ == "__main__":
    main()
