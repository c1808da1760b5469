"""Perplexity of the embedded model on the repo's fixed text, per dtype and quantization.

    .venv/bin/python benchmarks/quality.py

The figures behind the defaults (sluice/loader/choices.py) and docs/BENCHMARKS.md;
tests/test_quality_gate.py holds the default within 1% of float32.
"""

from __future__ import annotations

from pathlib import Path

from sluice.config import ModelConfig
from sluice.loader.loaded_model import load_model
from sluice.models.scoring import perplexity

TEXT = Path(__file__).parent.parent / "tests" / "data" / "quality_text.txt"
# (dtype, weight quantization, activation quantization)
SETTINGS = [("float32", None, None), ("bfloat16", None, None), ("bfloat16", "int8", None),
            ("bfloat16", "int4", None), ("bfloat16", "int4", "int8"),
            ("auto", "auto", "auto")]  # fmt: skip
# Steps of 8 tokens take the decode kernels; of 64, the large steps' matmuls.
CHUNKS = (8, 64)


def main() -> None:
    text = TEXT.read_text(encoding="utf-8")
    reference: dict[int, float] = {}
    for dtype, quantization, activations in SETTINGS:
        loaded = load_model(ModelConfig(dtype=dtype, quantization=quantization,
                                        activation_quantization=activations))  # fmt: skip
        ids = loaded.tokenizer.encode(text)
        label = " ".join(
            [dtype, quantization or "", f"{activations} activations" if activations else ""]
        ).strip()
        for chunk in CHUNKS:
            ppl = perplexity(loaded.model, ids, chunk)
            reference.setdefault(chunk, ppl)
            print(f"{label:<34} steps of {chunk:>2}: perplexity {ppl:8.4f}  "
                  f"{ppl / reference[chunk] - 1:+.2%}  ({len(ids)} tokens)")  # fmt: skip


if __name__ == "__main__":
    main()
