"""gpt-oss's MoE layer with MXFP4 experts: the per-expert path against one native call.

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/mxfp4_moe_layer.py [--rounds 15]

A gpt-oss-20b-shaped layer (hidden 2880, 32 experts top-4, intermediate
2880) with random MXFP4 groups and biases, bfloat16 activations. Each round
draws a routing and times both paths on it, alternating which goes first:
moe.py's per-expert path (`MoeBlock.expert_outputs` over Mxfp4Experts.forward,
one mxfp4_matmul a projection a chosen expert, then the rank-order sum) and
`Mxfp4Experts.weighted_sum` (moe_mxfp4.c, one call). Times are the calling
thread's CPU time (time.thread_time), so other work on a shared machine
does not count; with OMP_NUM_THREADS=1 that is all of the call's work. The
report gives each path's median ms and the ratio of the medians, for a
decode step (1 token) and 16 tokens. Checks the two paths' bits agree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from sluice.models.moe import MoeBlock
from sluice.models.mxfp4_experts import ClampedSwiglu, Mxfp4Experts

HIDDEN, INTER, EXPERTS, TOP_K = 2880, 2880, 32, 4


def random_experts(g: torch.Generator) -> Mxfp4Experts:
    def groups(rows: int, cols: int) -> torch.Tensor:
        stack = torch.randint(0, 256, (EXPERTS, rows, cols // 32, 17), dtype=torch.uint8,
                              generator=g)  # fmt: skip
        stack[..., 0] = torch.randint(118, 124, stack.shape[:-1], dtype=torch.uint8, generator=g)
        return stack

    biases = (torch.randn(EXPERTS, 2 * INTER, generator=g).to(torch.bfloat16),
              torch.randn(EXPERTS, HIDDEN, generator=g).to(torch.bfloat16))  # fmt: skip
    return Mxfp4Experts(groups(2 * INTER, HIDDEN), groups(HIDDEN, INTER), *biases)


def per_expert(kept: Mxfp4Experts, swiglu, x, ids, weights) -> torch.Tensor:
    """MoeBlock.forward without `weighted_sum`: moe.py's own expert_outputs and rank-order sum."""
    block = SimpleNamespace(num_experts=EXPERTS, top_k=TOP_K,
                            _expert_rows=lambda e, s, rows: kept(e, s, rows))  # fmt: skip
    outputs = MoeBlock.expert_outputs(block, x, ids, swiglu)  # type: ignore[arg-type]
    total = outputs[:, 0].float().mul_(weights[:, :1])
    for rank in range(1, TOP_K):
        total.add_(outputs[:, rank].float().mul_(weights[:, rank : rank + 1]))
    return total


def cpu_ms(fn) -> tuple[float, torch.Tensor]:
    start = time.thread_time()
    out = fn()
    return (time.thread_time() - start) * 1e3, out


def measure(kept: Mxfp4Experts, tokens: int, rounds: int, g: torch.Generator) -> None:
    swiglu = ClampedSwiglu(1.702, 7.0)
    times: dict[str, list[float]] = {"per expert": [], "one call": []}
    for round_ in range(rounds + 1):
        x = torch.randn(tokens, HIDDEN, generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(tokens)])
        weights = torch.rand(tokens, TOP_K, generator=g).softmax(-1)
        step = (x, ids, weights)
        paths = {
            "per expert": lambda step=step: per_expert(kept, swiglu, *step),
            "one call": lambda step=step: kept.weighted_sum(*step, swiglu),
        }
        order = list(paths) if round_ % 2 else list(paths)[::-1]
        results = {}
        for name in order:
            ms, results[name] = cpu_ms(paths[name])
            if round_:  # the first round warms up
                times[name].append(ms)
        assert torch.equal(results["per expert"], results["one call"]), "bits differ"
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{tokens:>3} tokens: per expert {medians['per expert']:.2f} ms, one call "
          f"{medians['one call']:.2f} ms, per expert / one call "
          f"{medians['per expert'] / medians['one call']:.3f}  ({rounds} rounds)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    kept = random_experts(g)
    print(f"torch threads {torch.get_num_threads()}; layer H {HIDDEN}, I {INTER}, "
          f"{EXPERTS} experts top-{TOP_K}, MXFP4, bfloat16 activations")  # fmt: skip
    for tokens in (1, 16):
        measure(kept, tokens, args.rounds, g)


if __name__ == "__main__":
    main()
