"""Fakes and checkers for tests and benchmarks: no model needed.

Re-exports lazily (`sluice.lazy_exports`): the fakes import each other,
never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.testing.fake_engine import FakeEngine, TokenScript, fake_logprobs, parrot
    from sluice.testing.fake_tokenizer import FakeTokenizer

__all__ = ["FakeEngine", "FakeTokenizer", "TokenScript", "fake_logprobs", "parrot"]
__getattr__ = lazy_exports(
    __name__,
    {
        "FakeEngine": "sluice.testing.fake_engine",
        "TokenScript": "sluice.testing.fake_engine",
        "fake_logprobs": "sluice.testing.fake_engine",
        "parrot": "sluice.testing.fake_engine",
        "FakeTokenizer": "sluice.testing.fake_tokenizer",
    },
)
