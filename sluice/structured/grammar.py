"""A `StructuredOutputSpec` turned into an llguidance grammar, and checked.

`grammar_of(spec)` is what the HTTP edge calls (off the event loop) to refuse
a bad schema, regex or grammar with a 400 naming the field before the request
is queued. The engine compiles the spec again in its own process, on a worker
thread (`sluice.structured.grammar_cache`), with `grammar_text` and a matcher
that validates as it builds. Neither needs the model's tokenizer here, so a
check here cannot catch a grammar that names a special token the tokenizer
lacks: the engine's matcher refuses that one (`sluice.structured.matcher`).

Limits, the same on both sides (a spec over one is a `GrammarLimitError`, a
400 naming the field at the edge):
- MAX_GRAMMAR_SOURCE_CHARS: the spec's source (schema JSON, pattern, choice
  list or grammar text), checked before any compile. A 1 MiB enum schema
  compiles in about 0.15 s of CPU.
- MAX_GRAMMAR_COMPILE_CPU_S: the CPU time one compile may take (measured on
  the compiling thread, so a busy machine does not turn a good grammar into a
  refusal). llguidance cannot be interrupted, so the compile finishes and is
  then refused; the refusal is cached like a grammar, so a client sending the
  same spec again costs nothing.

JSON schemas compile with flexible whitespace between tokens (as vLLM's
llguidance backend does by default); the schema's own keywords decide the rest.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import llguidance

from sluice.structured.spec import StructuredOutputSpec

# Distinct specs whose checked grammar (or refusal) is kept (per process),
# and the most characters they may hold together (spec and grammar texts):
# one 80,000-value enum is about 0.9 MB of each, so a count alone let a
# client pin some 450 MB with 256 fresh ones.
GRAMMAR_CACHE_SIZE = 256
GRAMMAR_CACHE_CHARS = 32 << 20
# Longest error text passed on to a client.
MAX_ERROR_CHARS = 500
ANY_JSON_OBJECT = '{"type": "object"}'
MAX_GRAMMAR_SOURCE_CHARS = 1 << 20
MAX_GRAMMAR_COMPILE_CPU_S = 1.0


class GrammarError(ValueError):
    """The spec does not compile; the message says why, in llguidance's words."""


class GrammarLimitError(GrammarError):
    """The spec is over a documented limit: its source size or its compile time."""


def grammar_of(spec: StructuredOutputSpec) -> str:
    """The llguidance grammar (JSON text) of `spec`, validated. Raises
    GrammarError (GrammarLimitError over a limit)."""
    result = CHECKED_GRAMMARS.get(spec)
    if result is None:
        result = _checked_grammar(spec)
        CHECKED_GRAMMARS.put(spec, result)
    if isinstance(result, GrammarError):
        raise type(result)(str(result))  # a fresh one: a cached error keeps no traceback
    return result


class CheckedGrammars:
    """The checked grammars of recent specs, least recently used dropped
    first, bounded in count and in characters. Thread-safe: the HTTP edge
    checks grammars on worker threads."""

    def __init__(self, max_entries: int, max_chars: int) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._entries: OrderedDict[StructuredOutputSpec, str | GrammarError] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, spec: StructuredOutputSpec) -> str | GrammarError | None:
        with self._lock:
            result = self._entries.get(spec)
            if result is not None:
                self._entries.move_to_end(spec)
            return result

    def put(self, spec: StructuredOutputSpec, result: str | GrammarError) -> None:
        size = _chars_of(spec, result)
        with self._lock:
            if spec in self._entries or size > self.max_chars:
                return
            self._entries[spec] = result
            self._chars += size
            while len(self._entries) > self.max_entries or self._chars > self.max_chars:
                old_spec, old_result = self._entries.popitem(last=False)
                self._chars -= _chars_of(old_spec, old_result)

    @property
    def chars(self) -> int:
        return self._chars


def _chars_of(spec: StructuredOutputSpec, result: str | GrammarError) -> int:
    return len(spec.value) + (len(result) if isinstance(result, str) else MAX_ERROR_CHARS)


CHECKED_GRAMMARS = CheckedGrammars(GRAMMAR_CACHE_SIZE, GRAMMAR_CACHE_CHARS)


def _checked_grammar(spec: StructuredOutputSpec) -> str | GrammarError:
    try:
        started_s = time.thread_time()
        grammar = grammar_text(spec)
        message = llguidance.LLMatcher.validate_grammar(grammar, None)
        if message:
            raise GrammarError(_short(message))
        check_compile_time(time.thread_time() - started_s)
    except GrammarError as error:
        return error
    return grammar


def grammar_text(spec: StructuredOutputSpec) -> str:
    """The llguidance grammar of `spec`, not yet validated (a matcher
    validates as it builds). Raises GrammarError."""
    check_source_size(spec)
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
            case "llguidance":
                return spec.value
    except ValueError as error:
        raise GrammarError(_short(str(error))) from None
    raise GrammarError(f"unknown structured output kind {spec.kind!r}")


def check_source_size(spec: StructuredOutputSpec) -> None:
    """Raises GrammarLimitError if the spec's source is over the size limit."""
    if len(spec.value) > MAX_GRAMMAR_SOURCE_CHARS:
        raise GrammarLimitError(
            f"the {spec.kind} is {len(spec.value)} characters long, over the limit of "
            f"{MAX_GRAMMAR_SOURCE_CHARS}"
        )


def check_compile_time(cpu_s: float) -> None:
    """Raises GrammarLimitError if a compile took more CPU than the limit."""
    if cpu_s > MAX_GRAMMAR_COMPILE_CPU_S:
        raise GrammarLimitError(
            f"compiling it took {cpu_s:.2f} s of CPU, over the limit of "
            f"{MAX_GRAMMAR_COMPILE_CPU_S} s"
        )


def _short(message: str) -> str:
    message = message.strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
