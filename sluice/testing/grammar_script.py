"""A fake engine's script whose output obeys the request's grammar, as a
model's sampled output does under constrained decoding.

`GrammarChoice` answers each request with the first of its candidate texts
that the request's structured-output spec accepts whole (any text, for a
request without one), and with `REFUSED` when none is: the test sees which
outputs the grammar left the model. The spec is compiled by the engine's own
`GrammarCompiler`, over a byte-level tokenizer (`byte_tokenizer`). It keeps
every request's prompt text and spec for the test to read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sluice.engine.sampling_params import SamplingParams
from sluice.structured.matcher import GrammarCompiler
from sluice.structured.spec import StructuredOutputSpec
from sluice.testing.byte_tokenizer import EOS_TOKEN_ID, byte_level_tokenizer
from sluice.testing.fake_tokenizer import FakeTokenizer

# What the script answers when the grammar allows none of its candidates.
REFUSED = "REFUSED"
# The byte tokenizer's byte b is token BYTE_OFFSET + b.
_BYTE_OFFSET = 3
_COMPILER = GrammarCompiler(byte_level_tokenizer(), 512, frozenset({EOS_TOKEN_ID}))


def accepts(spec: StructuredOutputSpec, text: str) -> bool:
    """Whether `spec`'s grammar derives exactly `text`."""
    matcher = _COMPILER.compile(spec).matcher("check").matcher
    is_consumed = matcher.consume_tokens([_BYTE_OFFSET + byte for byte in text.encode()])
    return is_consumed and matcher.is_accepting()


class GrammarChoice:
    """A `FakeEngine` script: the first candidate the grammar accepts."""

    def __init__(self, tokenizer: FakeTokenizer, candidates: Sequence[str]):
        self.tokenizer = tokenizer
        self._candidates = candidates
        self.prompts: list[str] = []
        self.specs: list[StructuredOutputSpec | None] = []

    def __call__(
        self, request_id: str, prompt: Sequence[int], params: SamplingParams
    ) -> Iterator[int]:
        spec = params.structured_output
        self.prompts.append(self.tokenizer.decode(list(prompt), skip_special_tokens=False))
        self.specs.append(spec)
        allowed = (text for text in self._candidates if spec is None or accepts(spec, text))
        return iter(self.tokenizer.encode(next(allowed, REFUSED)))
