"""Where an engine step's time goes, at batch 1, 16 and 64, with the default model settings.

    .venv/bin/python benchmarks/step_profile.py [--batches 1,16,64] [--steps 20] [--dtype auto]
        [--model embedded|FOLDER|FILE.gguf] [--max-model-len 4096]

Runs the engine core in this process (as the engine process does: the same
EngineCore, the same threads), fills the batch with greedy requests that
never stop, and times each phase of the decode steps once every request is
decoding: scheduling, input building, the model's layers, the logits, the
sampler, and the update that emits the deltas. The model's layers are then
split by op (matmuls, attention, the rest) with torch's profiler over a few
more steps. Prints milliseconds per step and shares.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams

PROMPT = "Write a long story about a lighthouse keeper and the sea."


class Phases:
    """Accumulates wall time per named phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name].append(time.perf_counter() - start)

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--model", default="embedded", help="'embedded', an HF folder or a .gguf")
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args()
    quantization = None if args.quantization == "none" else args.quantization
    core = EngineCore(
        EngineConfig(model=ModelConfig(model=args.model, dtype=args.dtype,
                                       quantization=quantization,
                                       max_model_len=args.max_model_len),
                     multiprocess=False)
    )  # fmt: skip
    print(f"model: {core.loaded.choices}; torch threads {torch.get_num_threads()}")
    prompt = core.loaded.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
    model = core.runner.model
    for batch in [int(b) for b in args.batches.split(",")]:
        ids = [f"b{batch}-{i}" for i in range(batch)]
        for request_id in ids:
            core.add_request(generation_request(request_id, prompt, params))
        for _ in range(3):  # prefill, then two decode steps
            core.step()
        phases = Phases()
        scheduler, runner = core.scheduler, core.runner
        originals = (scheduler.schedule, scheduler.update, runner.sampler, model.forward,
                     model.compute_logits)  # fmt: skip
        scheduler.schedule = phases.wrap("schedule", scheduler.schedule)
        scheduler.update = phases.wrap("update (deltas)", scheduler.update)
        runner.sampler = phases.wrap("sampler", runner.sampler)
        model.forward = phases.wrap("model layers", model.forward)
        model.compute_logits = phases.wrap("logits (lm_head)", model.compute_logits)
        steps = []
        for _ in range(args.steps):
            start = time.perf_counter()
            core.step()
            steps.append(time.perf_counter() - start)
        (scheduler.schedule, scheduler.update, runner.sampler, model.forward,
         model.compute_logits) = originals  # fmt: skip
        step_s = statistics.median(steps)
        print(f"\n== batch {batch}: step {step_s * 1e3:.1f} ms (median of {args.steps}), "
              f"{batch / step_s:.0f} tok/s")  # fmt: skip
        accounted = 0.0
        for name, values in phases.seconds.items():
            ms = statistics.median(values) * 1e3
            accounted += ms
            print(f"  {name:<18} {ms:7.2f} ms  {ms / (step_s * 1e3):6.1%}")
        other = step_s * 1e3 - accounted
        print(f"  {'inputs, other':<18} {other:7.2f} ms  {other / (step_s * 1e3):6.1%}")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                core.step()
        by_kind: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            name = event.key
            kind = ("matmul" if "linear" in name or "int4pack" in name or "int8pack" in name
                    or "_int_mm" in name
                    or name in ("aten::mm", "aten::addmm") else
                    "attention" if "attention" in name or "flash" in name else "other ops")  # fmt: skip
            by_kind[kind] += event.self_cpu_time_total / 3 / 1e3
        total = sum(by_kind.values())
        print("  profiled ops (ms/step, profiler overhead included; native kernels not listed):")
        for kind, ms in sorted(by_kind.items(), key=lambda item: -item[1]):
            print(f"    {kind:<16} {ms:7.2f} ms  {ms / total:6.1%}")
        core.abort_requests(ids)
        while core.has_unfinished_requests():
            core.step()


if __name__ == "__main__":
    main()
