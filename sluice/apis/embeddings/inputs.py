"""A pooling request's texts as the token sequences its engine pools.

Texts are encoded with the model's special tokens (BERT's [CLS] ... [SEP],
a decoder embedder's end token), exactly as sentence-transformers encodes
them. A sequence longer than the model's limit is an error naming the limit,
unless the request asks to truncate (`truncate_to`: vLLM's
truncate_prompt_tokens, Ollama's truncate); then the text is cut from its
end with the special tokens kept, as sentence-transformers cuts at its
max_seq_length.

A (query, document) pair for scoring becomes one sequence the model's way
(`PoolingSpec.pair_format`): the tokenizer's pair encoding with token types
(a BERT cross-encoder), or Qwen3-Reranker's prompt, whose document is cut
first when it must be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tokenizers

from sluice.engine.pooling_params import PoolingInput, PoolingSpec
from sluice.errors import InvalidRequestError, PromptTooLongError

# Qwen3-Reranker's prompt around "<Instruct>: ...\n<Query>: ...\n<Document>: ..."
# (its model card's format_instruction, prefix and suffix).
YES_NO_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
YES_NO_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
YES_NO_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass(frozen=True, slots=True)
class PoolingModelView:
    """What the edge needs of a pooling model to write its inputs."""

    name: str
    backend: tokenizers.Tokenizer
    vocab_size: int
    max_model_len: int
    spec: PoolingSpec


def pooling_backend(backend: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """A copy of a model's tokenizer without the padding and truncation its
    tokenizer.json may switch on (all-MiniLM-L6-v2's pads every text to 128
    tokens): inputs are cut here, to the request's and the model's limits,
    and never padded."""
    copy = tokenizers.Tokenizer.from_str(backend.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy


def truncation_of(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    """vLLM's truncate_prompt_tokens as a length to cut to (-1: the model's limit)."""
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1 or truncate_prompt_tokens > max_model_len:
        return max_model_len
    return max(truncate_prompt_tokens, 1)


def text_inputs(
    texts: Sequence[str], model: PoolingModelView, truncate_to: int | None, param: str
) -> list[PoolingInput]:
    """One sequence per text, special tokens included."""
    backend = model.backend
    encodings = backend.encode_batch(list(texts), add_special_tokens=False)
    num_special = backend.num_special_tokens_to_add(False)
    inputs = []
    for index, encoding in enumerate(encodings):
        if truncate_to is not None and len(encoding.ids) + num_special > truncate_to:
            encoding.truncate(max(truncate_to - num_special, 0))
        ids = backend.post_process(encoding, None, True).ids
        inputs.append(PoolingInput(_checked(ids, model, index, param)))
    return inputs


def token_inputs(
    sequences: Sequence[Sequence[int]], model: PoolingModelView, truncate_to: int | None
) -> list[PoolingInput]:
    """Token ids as given (no special tokens added), each id in the vocabulary."""
    inputs = []
    for index, ids in enumerate(sequences):
        bad = next((t for t in ids if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary (0 to {model.vocab_size - 1})",
                param="input",
            )
        ids = list(ids)[: truncate_to or len(ids)]
        inputs.append(PoolingInput(_checked(ids, model, index, "input")))
    return inputs


def pair_inputs(
    pairs: Sequence[tuple[str, str]], model: PoolingModelView, truncate_to: int | None, param: str
) -> list[PoolingInput]:
    """One sequence per (query, document) pair, written the model's way."""
    if model.spec.pair_format == "yes_no":
        return [_yes_no_input(q, d, model, truncate_to, i, param) for i, (q, d) in enumerate(pairs)]
    backend = model.backend
    num_special = backend.num_special_tokens_to_add(True)
    inputs = []
    for index, (query, document) in enumerate(pairs):
        first, second = backend.encode_batch([query, document], add_special_tokens=False)
        if truncate_to is not None:
            room = max(truncate_to - num_special, 0)
            second.truncate(max(room - len(first.ids), 0))  # the document goes first
            first.truncate(max(room - len(second.ids), 0))
        encoding = backend.post_process(first, second, True)
        ids = _checked(encoding.ids, model, index, param)
        inputs.append(PoolingInput(ids, list(encoding.type_ids)))
    return inputs


def _yes_no_input(
    query: str, document: str, model: PoolingModelView, truncate_to: int | None, index: int,
    param: str,
) -> PoolingInput:  # fmt: skip
    backend = model.backend
    prefix, head, body, suffix = (
        backend.encode(text, add_special_tokens=False).ids
        for text in (
            YES_NO_PREFIX,
            f"<Instruct>: {YES_NO_INSTRUCTION}\n<Query>: {query}\n<Document>: ",
            document,
            YES_NO_SUFFIX,
        )
    )
    if truncate_to is not None:
        room = truncate_to - len(prefix) - len(head) - len(suffix)
        body = body[: max(room, 0)]
    return PoolingInput(_checked(prefix + head + body + suffix, model, index, param))


def _checked(ids: list[int], model: PoolingModelView, index: int, param: str) -> list[int]:
    if not ids:
        raise InvalidRequestError(f"{param} {index} is empty", param=param)
    if len(ids) > model.max_model_len:
        raise PromptTooLongError(
            f"{param} {index} is {len(ids)} tokens; {model.name} takes at most "
            f"{model.max_model_len}; ask for truncation to cut it (truncate_prompt_tokens, "
            "Ollama's truncate)",
            num_prompt_tokens=len(ids),
            max_prompt_tokens=model.max_model_len,
            param=param,
        )
    return ids
