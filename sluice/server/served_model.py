"""What the HTTP edge knows of the model it serves, without its weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sluice.frontend.detokenizer import DecodingTokenizer
from sluice.frontend.preprocess import PromptTokenizer


class ServedTokenizer(PromptTokenizer, DecodingTokenizer, Protocol):
    """What the app uses of `sluice.tokenizer.Tokenizer` (tests pass the fake one)."""

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    # The chat template's text (None without one): its tool-call format.
    chat_template_source: str | None


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The model as the app names it, tokenizes for it and bounds its context;
    read from small files in the server process (`launch.describe_model`), so
    the process that serves HTTP never holds the weights."""

    name: str
    tokenizer: ServedTokenizer
    max_model_len: int
