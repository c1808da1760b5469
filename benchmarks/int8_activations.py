"""Int8 activations (W8A8) against bfloat16 for the large steps, interleaved in one process.

    .venv/bin/python benchmarks/int8_activations.py [--batches 16,48,64] [--steps 60]
        [--prefill-tokens 480,2000 ("" for none)] [--rounds 4] [--force]

One engine core with the default settings (on a VNNI CPU: bfloat16 + int4 +
int8 activations). For each batch, decode steps alternate between the two
paths of q/k/v, o and gate/up (`Linear._large_matmul`: the W8A8 layer or the
dense bfloat16 matmul on the same weights), so the machine's drift hits both
alike; the figure is the ratio of the medians. Then prefills of the given
prompt lengths, the paths alternating round by round. `--force` sends every
step through W8A8, below the threshold (`Int8ActivationLinear.min_rows`) too
(to find it); the other side keeps weight-only int4 for the smallest steps
(the column is named bf16 for both).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _interleaved import decode_step_medians

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.models.calibration import INT8_ACTIVATION_MATRICES

TEXT = Path(__file__).parent.parent / "tests" / "data" / "quality_text.txt"
PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,48,64")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prefill-tokens", default="480,2000")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    core = EngineCore(EngineConfig(model=ModelConfig(), multiprocess=False))
    print(f"model: {core.loaded.choices}")
    targets = [
        getattr(layer, name)
        for layer in core.runner.model.layers
        for name in INT8_ACTIVATION_MATRICES
    ]
    if not all(t.int8_activations for t in targets):
        raise SystemExit("this machine's defaults have no int8 activations (no VNNI?)")
    shipped_rows = {t: t.min_large_rows for t in targets}

    def use(path: str) -> None:
        """w8a8: these matrices' steps from the shipped threshold on (every
        step with --force) through W8A8; bf16: the paths without it
        (weight-only int4 up to its row limit, the dense bfloat16 matmul above)."""
        for t in targets:
            if path == "w8a8":
                t._large_matmul = t.int8_activations.forward
                t.min_large_rows = 1 if args.force else shipped_rows[t]
            else:
                t._large_matmul, t.min_large_rows = t._dense_matmul, sys.maxsize

    tokenizer = core.loaded.tokenizer
    prompt = tokenizer.encode(PROMPT)
    for batch in [int(b) for b in args.batches.split(",")]:
        bf16, w8a8 = decode_step_medians(core, prompt, batch, args.steps, use, ("bf16", "w8a8"))
        print(f"batch {batch:>3}: bf16 {bf16:6.1f} ms, w8a8 {w8a8:6.1f} ms, "
              f"bf16 / w8a8 {bf16 / w8a8:.3f}", flush=True)  # fmt: skip
    text_ids = tokenizer.encode(TEXT.read_text(encoding="utf-8") * 8)
    for length in [int(n) for n in args.prefill_tokens.split(",") if n]:  # "" skips them
        seconds = {"bf16": [], "w8a8": []}
        for i in range(2 * args.rounds):
            path = ("bf16", "w8a8")[i % 2]
            use(path)
            core.kv.reset_prefix_cache()
            core.add_request(
                generation_request(
                    f"p{length}-{i}", text_ids[:length], SamplingParams(max_tokens=1)
                )
            )
            start = time.perf_counter()
            while core.has_unfinished_requests():
                core.step()
            seconds[path].append(time.perf_counter() - start)
        bf16, w8a8 = (statistics.median(seconds[p]) * 1e3 for p in ("bf16", "w8a8"))
        print(f"prefill {length}: bf16 {bf16:6.0f} ms, w8a8 {w8a8:6.0f} ms, "
              f"bf16 / w8a8 {bf16 / w8a8:.3f}", flush=True)  # fmt: skip
    print(f"(the shipped threshold: {targets[0].int8_activations.min_rows} rows)")


if __name__ == "__main__":
    main()
