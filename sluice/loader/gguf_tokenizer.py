"""A GGUF's vocabulary as an HF fast tokenizer, built by transformers' GGUF converter.

transformers reads the vocabulary (`tokenizer.*` metadata) only of GGUFs
whose `general.architecture` it knows. A family it does not know but whose
vocabulary it converts under another name (SmolLM3's is Llama 3's) declares
that name (`GgufFamily.tokenizer_architecture`): the tokenizer metadata is
then copied, alone, into a small GGUF of that architecture, which
transformers converts. The model's own metadata plays no part in the
tokenizer, so the result is what the file's vocabulary says.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from sluice.errors import ModelLoadError
from sluice.loader import gguf_llama

_TOKENIZER_KEYS = "tokenizer."


def write_tokenizer(gguf_path: Path, folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json for `gguf_path` into `folder`."""
    family = gguf_llama.family(GGUFReader(gguf_path)).gguf
    stand_in = None if family is None else family.tokenizer_architecture
    if stand_in is None:
        _convert(gguf_path, gguf_path, folder)
        return
    with tempfile.TemporaryDirectory() as temp:
        vocabulary = Path(temp) / "tokenizer.gguf"
        _write_vocabulary(GGUFReader(gguf_path), vocabulary, stand_in)
        _convert(vocabulary, gguf_path, folder)


def _write_vocabulary(reader: GGUFReader, path: Path, architecture: str) -> None:
    """The reader's tokenizer metadata alone, in a GGUF of `architecture`."""
    writer = GGUFWriter(str(path), architecture)
    for key, field in reader.fields.items():
        if key.startswith(_TOKENIZER_KEYS):
            value_type = field.types[0]
            item_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), value_type, sub_type=item_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _convert(source: Path, gguf_path: Path, folder: Path) -> None:
    # transformers is needed here only; runtime loading uses `tokenizers`.
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(source.parent), gguf_file=source.name, local_files_only=True
        )
    except Exception as exc:
        text = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        raise ModelLoadError(f"cannot build a tokenizer from GGUF {gguf_path}: {reason}") from exc
    tokenizer.save_pretrained(str(folder))
