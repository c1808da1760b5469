"""A `StructuredOutputSpec` turned into an llguidance grammar, and checked.

`grammar_of(spec)` is what both sides use: the HTTP edge calls it (off the
event loop) to refuse a bad schema, regex or grammar with a 400 before the
request is queued; the engine calls it again before it builds a matcher (the
cache makes that free for a spec seen before). Neither needs the model's
tokenizer, so a check here cannot catch a grammar that names a special token
the tokenizer lacks: the engine's matcher refuses that one
(`sluice.structured.matcher`).

JSON schemas compile with flexible whitespace between tokens (as vLLM's
llguidance backend does by default); the schema's own keywords decide the rest.
"""

from __future__ import annotations

import functools

import llguidance

from sluice.structured.spec import StructuredOutputSpec

# Distinct specs whose compiled grammar is kept (per process).
GRAMMAR_CACHE_SIZE = 256
# Longest error text passed on to a client.
MAX_ERROR_CHARS = 500
ANY_JSON_OBJECT = '{"type": "object"}'


class GrammarError(ValueError):
    """The spec does not compile; the message says why, in llguidance's words."""


@functools.lru_cache(maxsize=GRAMMAR_CACHE_SIZE)
def grammar_of(spec: StructuredOutputSpec) -> str:
    """The llguidance grammar (JSON text) of `spec`. Raises GrammarError."""
    grammar = _compile(spec)
    message = llguidance.LLMatcher.validate_grammar(grammar, None)
    if message:
        raise GrammarError(_short(message))
    return grammar


def _compile(spec: StructuredOutputSpec) -> str:
    try:
        match spec.kind:
            case "json_schema":
                return llguidance.LLMatcher.grammar_from_json_schema(spec.value)
            case "json_object":
                return llguidance.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT)
            case "regex":
                return llguidance.LLMatcher.grammar_from_regex(spec.value)
            case "choice":
                return llguidance.grammar_from("choice", spec.value)
            case "grammar":
                return llguidance.grammar_from("grammar", spec.value)
    except ValueError as error:
        raise GrammarError(_short(str(error))) from None
    raise GrammarError(f"unknown structured output kind {spec.kind!r}")


def _short(message: str) -> str:
    message = message.strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
