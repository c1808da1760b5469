"""The cost of batch-invariant mode: decode step time with and without it.

    .venv/bin/python benchmarks/batch_invariant.py [--batches 1,16,64] [--rounds 5]
        [--dtype bfloat16] [--quantization auto] [--threads 2]

Two engine cores on the embedded model, one per mode, in this process. For
each batch size and round, each core decodes the same greedy requests
(`--max-tokens` each); we take the median step time of the decode-only steps.
The two modes run alternately, the first one switching every round: this
machine is shared, and a neighbour's burst then hits both. Printed: each
mode's median over rounds, and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams


def decode_step_s(core: EngineCore, batch: int, max_tokens: int) -> float:
    """Median seconds of the steps where every request decodes one token."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    tokenizer = core.loaded.tokenizer
    for i in range(batch):
        prompt = tokenizer.encode(f"Request {i}: write a long story about the number {i}.")
        core.add_request(generation_request(f"bench-{time.monotonic_ns()}-{i}", prompt, params))
    steps_s, started = [], set()
    while core.has_unfinished_requests():
        # Once every request has its first token, each step decodes them all.
        is_decode_only = len(started) == batch
        start = time.perf_counter()
        deltas = core.step()
        if is_decode_only:
            steps_s.append(time.perf_counter() - start)
        started.update(delta.request_id for delta in deltas)
    return statistics.median(steps_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quantization = None if args.quantization == "none" else args.quantization
    cores = {
        mode: EngineCore(
            EngineConfig(
                model=ModelConfig(
                    dtype=args.dtype, quantization=quantization, batch_invariant=mode == "invariant"
                ),
                multiprocess=False,
            )
        )
        for mode in ("default", "invariant")
    }
    print(f"model: {cores['default'].loaded.choices}; torch threads {torch.get_num_threads()}")
    for batch in map(int, args.batches.split(",")):
        times: dict[str, list[float]] = {mode: [] for mode in cores}
        for round_number in range(args.rounds):
            order = list(cores) if round_number % 2 == 0 else list(cores)[::-1]
            for mode in order:
                times[mode].append(decode_step_s(cores[mode], batch, args.max_tokens))
        ratios = [i / d for d, i in zip(times["default"], times["invariant"], strict=True)]
        print(
            f"batch {batch:3d}: default {statistics.median(times['default']) * 1e3:7.2f} ms, "
            f"invariant {statistics.median(times['invariant']) * 1e3:7.2f} ms per decode step; "
            f"invariant/default {statistics.median(ratios):.2f} "
            f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
