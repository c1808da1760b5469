"""How long a grammar request stalls the streams already running (issue 25, item 9).

    .venv/bin/python benchmarks/grammar_stall.py [--streams 4] [--enum-kb 790] [--threads N]

Runs the engine core in this process on the embedded model (default
settings) and drives it as the engine loop does: between two steps, the
inputs that arrived are handed to `add_request`, then the batch steps. A
stream's token gap is the time from the end of one step to the end of the
next, inputs included. With `--streams` free greedy streams decoding, it
prints the median gap without grammar requests, then the largest gap while
each case arrives and until its request has its first token, and the time
the loop spent in `add_request` handing it over:
- cold: a new enum schema of about `--enum-kb` KB (never seen by the engine);
- cached: the same schema again, in a new request;
- n=3: a new schema of the same size, for 3 choices at once.
It also prints how many steps each case took to its first token. The script
uses only `add_request` and `step`, so it runs against any version of the core.
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
from sluice.structured.spec import StructuredOutputSpec

PROMPT = "Pick one value from the list."
FREE = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)


def enum_schema(kb: int, salt: str) -> StructuredOutputSpec:
    """An enum schema of about `kb` KB of JSON; `salt` makes it a new spec."""
    value = f"{salt}-option-value-000000"
    count = kb * 1000 // (len(value) + 3)
    return StructuredOutputSpec.json_schema(
        {"enum": [f"{salt}-option-value-{i:06d}" for i in range(count)]}
    )


class Loop:
    """The engine loop's shape: inputs between steps, then one step."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.last_end = time.perf_counter()
        self.first_token: dict[str, int] = {}
        self.num_steps = 0
        # Time spent in add_request, summed (s).
        self.handover_s = 0.0

    def turn(self, inputs=()) -> float:
        """One pass: hand over `inputs`, step; returns the token gap (s)."""
        start = time.perf_counter()
        for request_id, prompt, params in inputs:
            self.core.add_request(generation_request(request_id, prompt, params))
        self.handover_s += time.perf_counter() - start
        for delta in self.core.step():
            if delta.new_token_ids:
                self.first_token.setdefault(delta.request_id, self.num_steps)
        self.num_steps += 1
        end = time.perf_counter()
        gap, self.last_end = end - self.last_end, end
        for error in getattr(self.core, "take_errors", list)():
            raise RuntimeError(f"request {error.request_id} failed: {error.message}")
        return gap


def stall(loop: Loop, inputs: list) -> tuple[float, float, int]:
    """Largest gap from the pass that hands `inputs` over until each has a
    token, the time add_request took, and the number of steps to the tokens."""
    start_step = loop.num_steps
    loop.handover_s = 0.0
    gaps = [loop.turn(inputs)]
    while not all(request_id in loop.first_token for request_id, _, _ in inputs):
        gaps.append(loop.turn())
    for request_id, _, _ in inputs:
        loop.core.abort_requests([request_id])
    return max(gaps), loop.handover_s, loop.num_steps - start_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--enum-kb", type=int, default=790)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (engine default)")
    args = parser.parse_args()
    core = EngineCore(
        EngineConfig(model=ModelConfig(), multiprocess=False, num_threads=args.threads)
    )
    print(f"model: {core.loaded.choices}; torch threads {torch.get_num_threads()}")
    prompt = core.loaded.tokenizer.encode(PROMPT)
    loop = Loop(core)
    # Warm-up: the llguidance tokenizer view and a small grammar, then the streams.
    stall(loop, [("warm", prompt, _constrained(enum_schema(1, "warm")))])
    for i in range(args.streams):
        core.add_request(generation_request(f"stream-{i}", prompt, FREE))
    baseline = [loop.turn() for _ in range(30)][5:]
    print(f"{args.streams} streams, median token gap {statistics.median(baseline) * 1e3:.1f} ms, "
          f"max {max(baseline) * 1e3:.1f} ms")  # fmt: skip
    cold = enum_schema(args.enum_kb, "cold")
    print(f"enum schema: {len(cold.value) / 1e6:.2f} MB")
    cases = {
        "cold": [("cold", prompt, _constrained(cold))],
        "cached": [("cached", prompt, _constrained(cold))],
        "n=3": [
            (f"n3-{i}", prompt, _constrained(enum_schema(args.enum_kb, "n3"))) for i in range(3)
        ],
    }
    for name, inputs in cases.items():
        for _ in range(5):
            loop.turn()  # the batch back to decoding only
        max_gap_s, handover_s, num_steps = stall(loop, inputs)
        print(f"{name:>6}: max token gap {max_gap_s * 1e3:.1f} ms, add_request "
              f"{handover_s * 1e3:.1f} ms, first token after {num_steps} steps")  # fmt: skip


def _constrained(spec: StructuredOutputSpec) -> SamplingParams:
    return SamplingParams(max_tokens=4, temperature=0.0, structured_output=spec)


if __name__ == "__main__":
    main()
