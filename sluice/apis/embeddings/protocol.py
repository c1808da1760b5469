"""Pydantic models of the embedding, rerank and score request bodies.

The rules of `apis/openai_protocol.py` (unknown fields ignored, `null` is the
default, NaN refused, ranges checked here so the error names the field).
Texts and token ids are strict: a number is not a text, `true` is not a
token id. Shapes:

    POST /v1/embeddings      OpenAI's: input (a text, texts, token ids, lists of
                             token ids), encoding_format, dimensions, user;
                             vLLM's truncate_prompt_tokens, add_special_tokens
    POST /v1/rerank          vLLM's / Jina's / Cohere's: query, documents (texts
    (/rerank, /v2/rerank)    or {"text": ...}), top_n, return_documents
    POST /v1/score           vLLM's: text_1, text_2 (a text or texts each)
    POST /api/embed          Ollama's: input (a text or texts), truncate,
                             dimensions, keep_alive, options
    POST /api/embeddings     Ollama's old one: prompt -> {"embedding"}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from sluice.apis.openai_protocol import OpenAIModel

# The most inputs (texts, documents, pairs) one request may carry: OpenAI's
# limit for /v1/embeddings.
MAX_INPUTS = 2048
# vLLM's truncate_prompt_tokens: keep the last k tokens; -1: the model's limit.
TruncateTokens = Annotated[int, Field(strict=True, ge=-1, le=2**31)]
Dimensions = Annotated[int, Field(strict=True, ge=1, le=2**31)]
TokenIds = Annotated[list[StrictInt], Field(max_length=2**24)]
# Ollama's `keep_alive`: a duration ("5m"), seconds, or -1 / 0 (one model stays loaded).
KeepAlive = str | Annotated[float, Field(ge=-(2**53), le=2**53)]


class EmbeddingsRequest(OpenAIModel):
    model: str | None = None
    input: (
        StrictStr
        | Annotated[list[StrictStr], Field(max_length=MAX_INPUTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(max_length=MAX_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Dimensions | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncateTokens | None = None
    add_special_tokens: StrictBool | None = None


class Document(OpenAIModel):
    text: StrictStr


class RerankRequest(OpenAIModel):
    model: str | None = None
    query: StrictStr
    documents: Annotated[list[StrictStr | Document], Field(max_length=MAX_INPUTS)]
    # The best `top_n` results; None or 0: all of them.
    top_n: Annotated[int, Field(strict=True, ge=0, le=2**31)] | None = None
    return_documents: StrictBool | None = None
    truncate_prompt_tokens: TruncateTokens | None = None

    def document_texts(self) -> list[str]:
        return [doc if isinstance(doc, str) else doc.text for doc in self.documents]


class ScoreRequest(OpenAIModel):
    model: str | None = None
    text_1: StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_INPUTS)]
    text_2: StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_INPUTS)]
    truncate_prompt_tokens: TruncateTokens | None = None


class OllamaEmbedRequest(OpenAIModel):
    model: str
    input: StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_INPUTS)] = ""
    # Cut each input to the context (Ollama's default); false: a too-long input is an error.
    truncate: StrictBool | None = None
    dimensions: Dimensions | None = None
    keep_alive: KeepAlive | None = None
    # The runner's options: none changes an embedding (accepted and ignored).
    options: dict[str, Any] | None = None


class OllamaEmbeddingsRequest(OpenAIModel):
    model: str
    prompt: StrictStr = ""
    keep_alive: KeepAlive | None = None
    options: dict[str, Any] | None = None
