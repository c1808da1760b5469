"""The projection of an OpenAI request (completions or chat), built as its
route builds it (sluice/apis/completions/routes.py, apis/chat/routes.py), for
tests that run the frontend without a route."""

from __future__ import annotations

from sluice.apis.chat.chunks import ChatChunks
from sluice.apis.completions.chunks import CompletionChunks
from sluice.frontend.detokenizer import DecodingTokenizer
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.request import GenerationRequest
from sluice.frontend.serving import ResponseChunks


def openai_chunks(request: GenerationRequest, tokenizer: DecodingTokenizer) -> ResponseChunks:
    """`request`'s chunks: chat's for kind "chat", else completions'."""
    builder = ChatChunks if request.kind == "chat" else CompletionChunks
    return builder(request, TokenStrings(tokenizer))
