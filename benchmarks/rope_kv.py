"""The native RoPE-and-cache-write kernel against the torch path, whole decode steps.

    .venv/bin/python benchmarks/rope_kv.py [--batches 1,16,64] [--steps 60]

One engine core with the default settings; for each batch the decode steps
alternate between the two paths (every layer's `rope_write_kv` kernel with
float32 angles, or `RopeAngles.rotate` then attention's `_write_kv`), so the
machine's drift hits both alike; the figure is the ratio of the medians.
"""

from __future__ import annotations

import argparse

from _interleaved import decode_step_medians

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.models.rope_norm import rope_cos_sin

PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    core = EngineCore(EngineConfig(model=ModelConfig(), multiprocess=False))
    model = core.runner.model
    if not model.native_rope:
        raise SystemExit("no native RoPE kernel here (not bfloat16 on CPU, or no compiler)")
    kernel = model.layers[0].rope_write_kv
    tables = {
        "native": (model.rope_cos, model.rope_sin),  # float32
        "torch": rope_cos_sin(model.config, model.dtype, model.rope_cos.device),
    }

    def use(path: str) -> None:
        model.native_rope = path == "native"
        for layer in model.layers:
            layer.rope_write_kv = kernel if model.native_rope else None
        model.rope_cos, model.rope_sin = tables[path]

    prompt = core.loaded.tokenizer.encode(PROMPT)
    for batch in [int(b) for b in args.batches.split(",")]:
        torch_ms, native_ms = decode_step_medians(core, prompt, batch, args.steps, use,
                                                  ("torch", "native"))  # fmt: skip
        print(f"batch {batch:>3}: torch path {torch_ms:6.2f} ms, native {native_ms:6.2f} ms, "
              f"torch / native {torch_ms / native_ms:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
