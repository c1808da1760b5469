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
SETTINGS = [("float32", None), ("bfloat16", None), ("bfloat16", "int8"), ("bfloat16", "int4"),
            ("auto", "auto")]  # fmt: skip


def main() -> None:
    text = TEXT.read_text(encoding="utf-8")
    reference = None
    for dtype, quantization in SETTINGS:
        loaded = load_model(ModelConfig(dtype=dtype, quantization=quantization))
        ids = loaded.tokenizer.encode(text)
        ppl = perplexity(loaded.model, ids)
        reference = reference or ppl
        label = f"{dtype} {quantization or ''}".strip()
        print(f"{label:<18} perplexity {ppl:8.4f}  {ppl / reference - 1:+.2%}  ({len(ids)} tokens)")


if __name__ == "__main__":
    main()
