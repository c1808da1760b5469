"""The batch mask of structured outputs: exactly the tokens a grammar forbids,
on the constrained rows only, for the model's whole vocabulary."""

from __future__ import annotations

import torch

from sluice.structured.bitmask import forbidden_tokens
from sluice.structured.matcher import GrammarCompiler, GrammarMatcher
from sluice.structured.spec import StructuredOutputSpec
from sluice.testing.byte_tokenizer import EOS_TOKEN_ID, byte_level_tokenizer

# Wider than the tokenizer (266 ids), as a model's embedding often is.
VOCAB_SIZE = 512
BYTE_OFFSET = 3  # byte b is token 3 + b
COMPILER = GrammarCompiler(byte_level_tokenizer(), VOCAB_SIZE, frozenset({EOS_TOKEN_ID}))


def matcher_of(spec: StructuredOutputSpec, request_id: str) -> GrammarMatcher:
    return COMPILER.compile(spec).matcher(request_id)


def allowed_ids(row: torch.Tensor) -> set[int]:
    return set((~row).nonzero().flatten().tolist())


def test_only_the_constrained_rows_are_masked_and_exactly():
    ab = matcher_of(StructuredOutputSpec.regex("[ab]c"), "ab")
    digit = matcher_of(StructuredOutputSpec.choice(["7"]), "digit")
    forbidden = forbidden_tokens([None, ab, None, digit], VOCAB_SIZE, torch.device("cpu"))
    assert forbidden.shape == (4, VOCAB_SIZE) and forbidden.dtype == torch.bool
    assert not forbidden[0].any() and not forbidden[2].any()
    assert allowed_ids(forbidden[1]) == {BYTE_OFFSET + ord("a"), BYTE_OFFSET + ord("b")}
    assert allowed_ids(forbidden[3]) == {BYTE_OFFSET + ord("7")}


def test_the_mask_follows_the_matcher_and_allows_eos_once_complete():
    matcher = matcher_of(StructuredOutputSpec.regex("a+"), "r")
    matcher.accept(BYTE_OFFSET + ord("a"))
    (row,) = forbidden_tokens([matcher], VOCAB_SIZE, torch.device("cpu"))
    assert allowed_ids(row) == {BYTE_OFFSET + ord("a"), EOS_TOKEN_ID}
    assert not matcher.is_terminated


def test_a_batch_without_matchers_gets_no_mask():
    assert forbidden_tokens([None, None], VOCAB_SIZE, torch.device("cpu")) is None
