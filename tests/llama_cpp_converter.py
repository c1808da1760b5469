"""llama.cpp's own convert_hf_to_gguf.py (the vendored tree gpt_oss_files.py
names, `SLUICE_LLAMA_CPP`) run on a tiny HF folder, its vocabulary step alone
replaced: a tiny model has no tokenizer the converter knows, so it gets
tests/gguf_files.py's byte BPE. Tests skip where the tree is absent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpt_oss_files import LLAMA_CPP

_CONVERT = """
import importlib, runpy, sys
sys.path[:0] = [{root!r}, {llama_cpp!r} + "/gguf-py", {llama_cpp!r}]  # its own gguf package
from tests.gguf_files import add_byte_bpe_vocab
module, _, name = {model_class!r}.partition(":")
def set_vocab(self):
    add_byte_bpe_vocab(self.gguf_writer, self.hparams["vocab_size"], ["<|endoftext|>", "<s>", "</s>"])
setattr(getattr(importlib.import_module(module), name), "set_vocab", set_vocab)
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


def require_converter() -> None:
    """Skip the calling test where llama.cpp's converter is not on this machine."""
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {LLAMA_CPP} (set SLUICE_LLAMA_CPP)")


def convert(folder: Path, out: Path, model_class: str, *options: str) -> Path:
    """`folder` through convert_hf_to_gguf.py into `out` (F32); `model_class`
    ("conversion.qwen:Qwen3_5TextModel") is the converter class whose vocabulary
    step is replaced; `options` are the converter's own."""
    script = LLAMA_CPP / "convert_hf_to_gguf.py"
    root = str(Path(__file__).resolve().parent.parent)
    code = _CONVERT.format(
        root=root, llama_cpp=str(LLAMA_CPP), script=str(script), model_class=model_class
    )
    command = [sys.executable, "-c", code, str(folder), "--outfile", str(out), "--outtype", "f32"]
    done = subprocess.run([*command, *options], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
