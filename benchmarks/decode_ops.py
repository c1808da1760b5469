"""Where one stream's decode step goes, per projection, on this thread's CPU time.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decode_ops.py --model FILE.gguf
        [--rounds 8] [--max-model-len 4096]

For a model whose projections are kept in GGUF blocks (QBlockLinear). Runs the
engine core in this process (speculation off) with one request decoding, and alternates two
things `--rounds` times: one engine step, and one pass over every layer's
qkv, o, gate_up and down projections and the lm_head in the step's order (one
row each, so each matrix streams from memory as in a step, not from cache).
Both are timed on this thread's CPU time (time.thread_time), which a loaded
machine's preemptions do not inflate, so the shares of a busy machine's runs
can be compared; the absolute figures cannot. Prints the step's median, each
projection's median over the passes, its share of the step and the bytes it
streams per second of CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.models.native.qblock import qblock_matmul_parts
from sluice.models.qblock_linear import QBlockLinear

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
clock = time.thread_time


def projection_pass(model) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds and packed bytes of each projection kind over all layers, then the lm_head."""
    seconds: dict[str, float] = defaultdict(float)
    sizes: dict[str, int] = defaultdict(int)
    linears = [(name, getattr(layer, name)) for layer in model.layers for name in PROJECTIONS]
    for name, linear in [*linears, ("lm_head", model.lm_head)]:
        if not isinstance(linear, QBlockLinear):
            raise SystemExit(f"{name} is not kept in GGUF blocks: {type(linear).__name__}")
        x = torch.randn(1, linear.in_features).to(torch.bfloat16)
        out = torch.empty(1, linear.out_features, dtype=torch.bfloat16)
        start = clock()
        qblock_matmul_parts(x, linear.part_array, out)
        seconds[name] += clock() - start
        sizes[name] += sum(part.packed.numel() for part in linear.parts)
    return seconds, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a .gguf file (blocks kept)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args()
    config = ModelConfig(model=args.model, max_model_len=args.max_model_len)
    # Speculation off: every step one decode row (issue 41's single-stream figures).
    engine = EngineConfig(model=config, multiprocess=False, speculative_config=None)
    core = EngineCore(engine)
    model = core.runner.model
    prompt = core.loaded.tokenizer.encode("Write a long story about a lighthouse keeper.")
    params = SamplingParams(max_tokens=1_000_000, temperature=0.0, ignore_eos=True)
    core.add_request(generation_request("decode", prompt, params))
    for _ in range(3):  # prefill, then two decode steps
        core.step()
    steps: list[float] = []
    passes: list[dict[str, float]] = []
    sizes: dict[str, int] = {}
    for _ in range(args.rounds):  # interleaved: drift hits both alike
        start = clock()
        core.step()
        steps.append(clock() - start)
        seconds, sizes = projection_pass(model)
        passes.append(seconds)
    step = statistics.median(steps)
    print(f"torch threads {torch.get_num_threads()}; step {step * 1e3:.1f} ms thread time "
          f"(median of {args.rounds}; min {min(steps) * 1e3:.1f})")  # fmt: skip
    total = 0.0
    for name in [*PROJECTIONS, "lm_head"]:
        median = statistics.median(seconds[name] for seconds in passes)
        total += median
        print(f"  {name:<13} {median * 1e3:7.2f} ms  {median / step:6.1%} of the step  "
              f"{sizes[name] / 2**20:7.0f} MiB  {sizes[name] / median / 1e9:5.1f} GB/s")  # fmt: skip
    print(f"  {'projections':<13} {total * 1e3:7.2f} ms  {total / step:6.1%} of the step")


if __name__ == "__main__":
    main()
