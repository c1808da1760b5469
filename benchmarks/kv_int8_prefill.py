"""A prompt's prefill over an int8 KV pool against a bf16 one (issue 44's default).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kv_int8_prefill.py [--tokens 3000]
        [--chunk 512] [--repeats 3]

The embedded model on its defaults, `--tokens` tokens of tests/data/quality_text.txt
(repeated) fed in chunks of `--chunk` over a paged pool of each KV dtype
(models/scoring.forward_chunks, the engine's prefill path: an int8 chunk
reads its blocks through kv_int8.prepare's dequantizing pass). Thread CPU
time, one thread; the two dtypes alternate run by run and the figure is the
median of the per-pair ratios, since on a shared machine only ratios of
interleaved repeats mean anything.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sluice.config import ModelConfig
from sluice.loader.gguf_convert import converted_folder
from sluice.loader.loaded_model import load_model
from sluice.loader.sources import embedded_gguf_path
from sluice.models.scoring import forward_chunks

TEXT = Path(__file__).parent.parent / "tests" / "data" / "quality_text.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = converted_folder(embedded_gguf_path(), Path(tempfile.mkdtemp()))
    loaded = load_model(ModelConfig(cache_dir=folder.parent))
    ids = loaded.tokenizer.encode(TEXT.read_text(encoding="utf-8"))
    ids = (ids * (args.tokens // len(ids) + 1))[: args.tokens]

    def seconds(kv_dtype: torch.dtype | None) -> float:
        start = time.thread_time()
        for _ in forward_chunks(loaded.model, ids, args.chunk, kv_dtype):
            pass
        return time.thread_time() - start

    seconds(None), seconds(torch.int8)  # warm
    pairs = [(seconds(None), seconds(torch.int8)) for _ in range(args.repeats)]
    ratios = [i / b for b, i in pairs]
    print(
        f"prefill of {len(ids)} tokens in chunks of {args.chunk}: "
        f"bf16 {statistics.median(b for b, _ in pairs):.2f} s, "
        f"int8 {statistics.median(i for _, i in pairs):.2f} s CPU; int8 / bf16 median "
        f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
