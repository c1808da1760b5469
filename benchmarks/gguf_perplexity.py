"""Perplexity of a GGUF on the repo's fixed text, sluice against llama.cpp's `llama-perplexity`.

    .venv/bin/python benchmarks/gguf_perplexity.py --gguf FILE [--gguf FILE ...] \
        --llama-perplexity /work/peers/build/bin/llama-perplexity [--ctx 128] \
        [--quantization auto gguf]

Both sides score the same tokens the way llama-perplexity does: the text
tokenized once (BOS first where the GGUF adds one), cut into chunks of `ctx`
tokens, each chunk's first token replaced by BOS, and only the second half of
each chunk scored (each scored token sees at least ctx/2 before it). sluice
feeds each chunk in steps of 8 tokens (the decode kernels) and of 64 (the
large steps'), once per `--quantization`. The figures behind the quality goal
of issue 41 (within 0.5% of llama.cpp on the same file).
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
from pathlib import Path

from gguf import GGUFReader

from sluice.config import ModelConfig
from sluice.loader.gguf_llama import field_value
from sluice.loader.loaded_model import load_model
from sluice.models.scoring import token_logprobs

TEXT = Path(__file__).parent.parent / "tests" / "data" / "quality_text.txt"
STEP_TOKENS = (8, 64)
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+)")


def chunks(ids: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: whole `ctx`-token windows, BOS at each start."""
    windows = [ids[start : start + ctx] for start in range(0, len(ids) - ctx + 1, ctx)]
    return [([bos] + window[1:]) if bos is not None else window for window in windows]


def sluice_perplexity(model, windows: list[list[int]], step_tokens: int) -> float:
    """exp(mean NLL) over the second half of each window, as llama-perplexity scores."""
    total, count = 0.0, 0
    for window in windows:
        first = len(window) // 2
        # token_logprobs[i] scores window[i + 1]; llama scores j + 1 for j in [first, ctx - 1).
        logprobs = token_logprobs(model, window, step_tokens)[first:]
        total -= sum(logprobs)
        count += len(logprobs)
    return math.exp(total / count)


def llama_perplexity(binary: Path, gguf: Path, ctx: int) -> float:
    result = subprocess.run(
        [str(binary), "-m", str(gguf), "-f", str(TEXT), "-c", str(ctx), "-b", str(ctx),
         "-t", "2", "--no-warmup"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    match = _FINAL.search(result.stdout + result.stderr)
    if match is None:
        raise RuntimeError(f"llama-perplexity printed no estimate:\n{result.stderr[-2000:]}")
    return float(match.group(1))


def bos_of(gguf: Path) -> int | None:
    reader = GGUFReader(gguf)
    add_bos = field_value(reader, "tokenizer.ggml.add_bos_token", True)
    return field_value(reader, "tokenizer.ggml.bos_token_id") if add_bos else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, action="append", required=True)
    parser.add_argument("--llama-perplexity", type=Path, default=None)
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--quantization", nargs="+", default=["auto", "gguf"])
    args = parser.parse_args()
    text = TEXT.read_text(encoding="utf-8")
    for gguf in args.gguf:
        bos = bos_of(gguf)
        reference = None
        if args.llama_perplexity is not None:
            reference = llama_perplexity(args.llama_perplexity, gguf, args.ctx)
            print(f"{gguf.name}: llama-perplexity -c {args.ctx}: {reference:.4f}")
        for quantization in args.quantization:
            loaded = load_model(ModelConfig(model=str(gguf), quantization=quantization))
            ids = ([bos] if bos is not None else []) + loaded.tokenizer.encode(text)
            windows = chunks(ids, args.ctx, bos)
            for step in STEP_TOKENS:
                ppl = sluice_perplexity(loaded.model, windows, step)
                versus = f"  {ppl / reference - 1:+.2%} vs llama.cpp" if reference else ""
                print(f"{gguf.name}: sluice --quantization {quantization}, steps of {step}: "
                      f"{ppl:.4f}{versus}  ({len(windows)} chunks of {args.ctx})")  # fmt: skip


if __name__ == "__main__":
    main()
