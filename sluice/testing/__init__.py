"""Fakes and checkers for tests and benchmarks: no model needed."""

from sluice.testing.fake_engine import FakeEngine, TokenScript, fake_logprobs, parrot
from sluice.testing.fake_tokenizer import FakeTokenizer

__all__ = ["FakeEngine", "FakeTokenizer", "TokenScript", "fake_logprobs", "parrot"]
