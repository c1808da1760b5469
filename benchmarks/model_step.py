"""Decode step latency of a SmolLM2-135M-shaped random model over the paged KV cache.

Each timed step is what the runner does for a decode-only batch: build
AttentionMetadata, run the model, compute logits for every sequence. Every
sequence first prefills `--context` tokens. With `--compare-hf`, the same
weights also run through transformers (eager attention, DynamicCache) for a
side-by-side step time.

    .venv/bin/python benchmarks/model_step.py --threads 2 --compare-hf
    .venv/bin/python benchmarks/model_step.py --threads 1 --clock thread --compare-hf
    .venv/bin/python benchmarks/model_step.py --threads 1 --clock thread \
        --dtypes bfloat16 --quantization none int8 int4 --batches 1 16 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from sluice.models.attention import AttentionMetadata, allocate_kv_caches
from sluice.models.decoder_config import DecoderConfig
from sluice.models.families.registry import parse_hf_config
from sluice.models.llama import LlamaForCausalLM
from sluice.models.quantization import QUANTIZATION_MODES

BLOCK_SIZE = 16
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
QUANTIZATIONS = ("none", *QUANTIZATION_MODES)


def random_hf_model() -> transformers.LlamaForCausalLM:
    """transformers' model with its own random init (std 0.02), eager attention."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SMOLLM2_135M)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval()


def load_ours(
    config: DecoderConfig, dtype: torch.dtype, hf_model: transformers.PreTrainedModel, mode: str
) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config, dtype, "cpu")
    model.load_weights(hf_model.state_dict().items())
    if mode != "none":
        model.quantize(mode)
    return model


@torch.inference_mode()
def time_ours(
    model: LlamaForCausalLM, batch: int, context: int, steps: int, clock=time.perf_counter
) -> list[float]:
    num_blocks = batch * (-(-(context + steps + 1) // BLOCK_SIZE))
    caches = allocate_kv_caches(model.config, num_blocks, BLOCK_SIZE, model.dtype, "cpu")
    per_seq = num_blocks // batch
    tables = [list(range(b * per_seq, (b + 1) * per_seq)) for b in range(batch)]
    prompt = torch.randint(0, model.config.vocab_size, (context,))
    for b in range(batch):  # prefill one sequence at a time, as a real server would
        meta = AttentionMetadata.build([context], [0], [tables[b]], BLOCK_SIZE, "cpu")
        model(prompt, torch.arange(context), caches, meta)
    tokens = torch.randint(0, model.config.vocab_size, (batch,))
    times = []
    for step in range(steps):
        seq_context = context + step
        start = clock()
        meta = AttentionMetadata.build(
            [1] * batch, [seq_context] * batch, tables, BLOCK_SIZE, "cpu"
        )
        positions = torch.full((batch,), seq_context)
        hidden = model(tokens, positions, caches, meta)  # [batch, hidden]
        tokens = model.compute_logits(hidden).argmax(-1)  # [batch]
        times.append(clock() - start)
    return times


@torch.inference_mode()
def time_transformers(
    model: transformers.PreTrainedModel,
    batch: int,
    context: int,
    steps: int,
    clock=time.perf_counter,
) -> list[float]:
    ids = torch.randint(0, model.config.vocab_size, (batch, context))
    out = model(ids, use_cache=True)
    cache, tokens = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
    times = []
    for _ in range(steps):
        start = clock()
        out = model(tokens, cache=cache, use_cache=True)
        cache, tokens = out.cache, out.logits[:, -1].float().argmax(-1, keepdim=True)
        times.append(clock() - start)
    return times


def report(label: str, times: list[float], batch: int, warmup: int) -> None:
    kept = sorted(times[warmup:])
    median_ms = statistics.median(kept) * 1e3
    best_ms = kept[0] * 1e3
    print(
        f"{label:<28} batch {batch:>2}: median {median_ms:7.1f} ms/step, best {best_ms:7.1f} ms,"
        f" {batch * 1e3 / median_ms:7.1f} tokens/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--compare-hf", action="store_true")
    parser.add_argument(
        "--quantization",
        nargs="+",
        default=["none"],
        choices=QUANTIZATIONS,
        help="weight-only modes to time, each on its own copy of the model",
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "thread"],
        default="wall",
        help="thread: CPU time of the one compute thread (needs --threads 1); it stays "
        "meaningful when other processes share the cores, wall time does not",
    )
    args = parser.parse_args()
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread measures one thread: use --threads 1")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    torch.set_num_threads(args.threads)
    config = parse_hf_config(SMOLLM2_135M)
    hf_model = random_hf_model()
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        models = {mode: load_ours(config, dtype, hf_model, mode) for mode in args.quantization}
        hf_model = hf_model.to(dtype)
        for batch in args.batches:
            for mode, model in models.items():
                times = time_ours(model, batch, args.context, args.steps + args.warmup, clock)
                label = dtype_name if mode == "none" else f"{dtype_name} {mode}"
                report(f"sluice {label}", times, batch, args.warmup)
            if args.compare_hf:
                times = time_transformers(
                    hf_model, batch, args.context, args.steps + args.warmup, clock
                )
                report(f"transformers eager {dtype_name}", times, batch, args.warmup)


if __name__ == "__main__":
    main()
