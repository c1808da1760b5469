"""What a pooling model is and what one pooling request asks: values that cross
the process boundary as msgpack (like `SamplingParams` for generation).

A pooling model turns each input sequence into one vector: an embedding
(task "embed") or a relevance score (task "score", a vector of one). Nothing
of it is kept between requests: no KV cache, no decode.

    PoolingSpec    the model's: its task, how hidden states become one vector,
                   whether that vector is normalized, how a (query, document)
                   pair becomes one sequence
    PoolingParams  one request's: the dimensions it keeps (Matryoshka)
"""

from __future__ import annotations

from typing import Literal

import msgspec

# "generate": a decoder that samples tokens (the generation engine).
# "embed": one vector per input. "score": one relevance score per (query, document).
ModelTask = Literal["generate", "embed", "score"]
# How a sequence's hidden states become one vector: their mean over its tokens
# (sentence-transformers' pooling_mode_mean_tokens), the first token's
# ([CLS]), or the last token's (decoder embedders: Qwen3-Embedding).
PoolingType = Literal["mean", "cls", "last"]
# How a (query, document) pair is written as one sequence for scoring:
# "pair": the tokenizer's pair encoding ([CLS] q [SEP] d [SEP] with token
# types 0 then 1: a BERT cross-encoder); "yes_no": Qwen3-Reranker's prompt,
# scored by the last token's "yes" against its "no"; "embeddings": the cosine
# similarity of the two texts' embeddings (an embedding model asked to score).
PairFormat = Literal["pair", "yes_no", "embeddings"]


class PoolingSpec(msgspec.Struct, frozen=True, kw_only=True):
    task: Literal["embed", "score"]
    pooling: PoolingType
    # The pooled vector is L2-normalized (sentence-transformers' Normalize module).
    normalize: bool
    # Width of one output vector: the embedding's (1 for a score).
    num_dimensions: int
    # How `dimensions` may cut an embedding (Matryoshka): () none; else the
    # sizes allowed, or (0,) for any size up to num_dimensions.
    matryoshka_dimensions: tuple[int, ...] = ()
    pair_format: PairFormat = "embeddings"
    # "yes_no" only: the token ids whose logits are compared (score =
    # sigmoid(logit[yes] - logit[no]), the softmax of the two).
    yes_token_id: int | None = None
    no_token_id: int | None = None
    # Sigmoid over a cross-encoder's one logit (sentence-transformers' CrossEncoder default).
    apply_sigmoid: bool = False

    def check_dimensions(self, dimensions: int) -> str | None:
        """Why `dimensions` cannot be served (None: it can)."""
        if not self.matryoshka_dimensions:
            return "this model does not support truncated embeddings (it is not Matryoshka)"
        if not 1 <= dimensions <= self.num_dimensions:
            return f"dimensions must be between 1 and {self.num_dimensions}"
        allowed = self.matryoshka_dimensions
        if allowed != (0,) and dimensions not in allowed:
            return f"dimensions must be one of {', '.join(map(str, allowed))}"
        return None


class PoolingParams(msgspec.Struct, frozen=True, kw_only=True):
    # Keep the first `dimensions` values of each embedding, then normalize
    # again if the model normalizes (vLLM's rule). None: the whole vector.
    dimensions: int | None = None


class PoolingInput(msgspec.Struct, frozen=True, array_like=True):
    """One sequence of a pooling request."""

    token_ids: list[int]
    # BERT's segment of each token (0: first text, 1: second); None: all 0.
    token_type_ids: list[int] | None = None
