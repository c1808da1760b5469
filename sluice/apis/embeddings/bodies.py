"""The answers of the embedding, rerank and score routes, from pooled vectors.

Every body is built from the engine's [num_inputs, num_dimensions] float32
array in one place per API; vectors go out as float32's shortest decimal
(orjson) or, with encoding_format "base64", as their little-endian float32
bytes (what OpenAI's SDK decodes). Scores of an embedding model are the
cosine similarity of the two texts' embeddings.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import numpy as np
import orjson

from sluice.engine.outputs import PooledOutput


def vectors_of(pooled: PooledOutput) -> np.ndarray:
    """[num_inputs, num_dimensions] float32, as the engine computed them."""
    return np.frombuffer(pooled.data, dtype=np.float32).reshape(pooled.num_inputs, -1)


def cosine(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """[N] cosine similarity of each row of `first` with the same row of `second`."""
    dots = np.einsum("nd,nd->n", first, second)
    norms = np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)
    return dots / np.maximum(norms, 1e-12)


def embeddings_body(
    model_name: str, vectors: np.ndarray, encoding_format: str, num_tokens: int
) -> bytes:
    """POST /v1/embeddings: OpenAI's list of embedding objects, with usage."""
    if encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        values: list[Any] = [base64.b64encode(row.tobytes()).decode() for row in little]
    else:
        values = list(vectors)
    data = [
        {"object": "embedding", "index": index, "embedding": value}
        for index, value in enumerate(values)
    ]
    return _dumps({
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model_name,
        "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    })  # fmt: skip


def rerank_body(
    model_name: str,
    scores: np.ndarray,
    documents: list[str],
    top_n: int | None,
    return_documents: bool,
    num_tokens: int,
) -> bytes:
    """POST /v1/rerank: the documents' indices and scores, best first (vLLM's, Jina's)."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    results = []
    for index in order[: top_n or len(order)]:
        result: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
        if return_documents:
            result["document"] = {"text": documents[index]}
        results.append(result)
    return _dumps({
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model_name,
        "usage": {"total_tokens": num_tokens},
        "results": results,
    })  # fmt: skip


def score_body(model_name: str, scores: np.ndarray, num_tokens: int) -> bytes:
    """POST /v1/score: one score object per pair, in order (vLLM's)."""
    data = [
        {"index": index, "object": "score", "score": float(score)}
        for index, score in enumerate(scores)
    ]
    return _dumps({
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model_name,
        "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens, "completion_tokens": 0},
    })  # fmt: skip


def ollama_embed_body(
    model_name: str, vectors: np.ndarray, num_tokens: int, total_ns: int
) -> bytes:
    """POST /api/embed: Ollama's embeddings and counts (durations in nanoseconds)."""
    return _dumps({
        "model": model_name,
        "embeddings": list(vectors),
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": num_tokens,
    })  # fmt: skip


def ollama_embedding_body(vectors: np.ndarray) -> bytes:
    """POST /api/embeddings (Ollama's old route): one embedding, or [] for no prompt."""
    return _dumps({"embedding": list(vectors[0]) if len(vectors) else []})


def _dumps(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
