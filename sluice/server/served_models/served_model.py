"""What the HTTP edge knows of the model it serves, without its weights."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from sluice.engine.messages import EngineReady
from sluice.engine.pooling_params import PoolingSpec
from sluice.errors import ModelLoadError
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
    # An embedder's or reranker's description (sluice/loader/pooling_model.py):
    # it serves /v1/embeddings, /v1/rerank and /v1/score, not generation.
    # None: a generation model.
    pooling: PoolingSpec | None = None

    def served_by(self, ready: EngineReady | None) -> ServedModel:
        """The model as the engine serves it: the server process reads the
        model's small files, the engine its weights, two readings of one model
        that must agree (a ModelLoadError naming what differs). The engine may
        hold a shorter context than described, never a longer one: where no
        --max-model-len was asked and the model's own does not fit in memory,
        it fits one (engine/startup.fit_max_model_len), and that is the context
        served. None: an engine that loads no model (the test fakes)."""
        if ready is None:
            return self
        if ready.model_name != self.name or ready.max_model_len > self.max_model_len:
            raise ModelLoadError(
                f"the engine loaded {ready.model_name!r} with a context of "
                f"{ready.max_model_len} tokens, but the server describes {self.name!r} "
                f"with {self.max_model_len}"
            )
        if ready.pooling != self.pooling:
            raise ModelLoadError(
                f"the engine serves {ready.model_name!r} as {ready.pooling}, but the "
                f"server describes it as {self.pooling}"
            )
        return replace(self, max_model_len=ready.max_model_len)
