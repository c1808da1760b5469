"""A real `tokenizers.Tokenizer` with one token per byte, for engine tests.

The tiny random model (vocab 512, EOS 2) comes without a tokenizer; grammar
masks need one (llguidance reads a tokenizer's JSON). This one is a byte-level
BPE like GPT-2's: ids 0-2 are `<unk>`, `<s>` and `</s>` (EOS), ids 3-258 the
256 bytes, then a few merges of common JSON pieces, so some tokens are longer
than a byte and a mask must reason over multi-byte tokens.
"""

from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
EOS_TOKEN_ID = 2
# Pairs merged into one token each, in merge order.
MERGES = (("{", '"'), ('"', ":"), ('"', ","), ('"', "}"), ("Ġ", '"'), ("t", "r"), ("tr", "u"))


def byte_level_tokenizer() -> tokenizers.Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_tokens = sorted(alphabet, key=_byte_value)
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *byte_tokens])}
    for left, right in MERGES:
        vocab[left + right] = len(vocab)
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab, list(MERGES)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def _byte_value(char: str) -> int:
    """The byte GPT-2's byte-level alphabet maps to `char`."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    if ord(char) in printable:
        return ord(char)
    others = [b for b in range(256) if b not in printable]
    return others[ord(char) - 256]
