"""Structured outputs: output constrained to a JSON schema, regex, choice or
grammar by masking the logits before sampling (llguidance).

    spec.py           StructuredOutputSpec: the frozen value a request carries
    grammar.py        spec -> llguidance grammar, checked, limited and cached (the edge)
    matcher.py        GrammarCompiler: spec -> CompiledGrammar -> one GrammarMatcher
                      per engine request
    grammar_cache.py  the engine's compiled grammars, compiled on a worker thread
    bitmask.py        the allowed tokens of a step's constrained rows, applied to logits

Re-exports lazily (`sluice.lazy_exports`), so holding a spec never imports
llguidance.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.structured.grammar import GrammarError, grammar_of
    from sluice.structured.spec import StructuredOutputSpec

__all__ = ["GrammarError", "StructuredOutputSpec", "grammar_of"]
__getattr__ = lazy_exports(
    __name__,
    {
        "GrammarError": "sluice.structured.grammar",
        "grammar_of": "sluice.structured.grammar",
        "StructuredOutputSpec": "sluice.structured.spec",
    },
)
