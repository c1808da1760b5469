"""One request's grammar state in the engine, and what makes it.

`GrammarCompiler` lives in the engine core (one per engine): it holds the
llguidance view of the model's tokenizer, and compiles a spec into a
`CompiledGrammar` (on the engine's grammar worker thread,
`sluice.structured.grammar_cache`). llguidance drops the GIL while it
compiles, so other streams keep stepping: served, cold 80,000-value enums
(~0.2 s of compile each) leave another stream's largest gaps where warm ones
leave them.

The tokenizer view is built with the compiler, before the engine serves:
building it holds the GIL (0.28 s for a 49k vocabulary, 0.7-1 s on a loaded
2-core machine). Built on the first structured request, as it once was, it
stalled every stream for that long (tests/test_structured_cold_grammar.py).

A `CompiledGrammar` is never advanced: each request starts from its own copy
of it, a `GrammarMatcher` (a copy costs well under a millisecond, where the
compile of a large schema costs a tenth of a second or more).

The matcher belongs to the engine loop like the `Request` that holds it: the
sampler reads its mask, the scheduler advances it with each sampled token and
drops it when the request finishes or is aborted.

Invariant: a matcher has consumed exactly the request's output tokens. A
preempted request keeps its outputs (they are recomputed as prefix, never
resampled), so its matcher stays valid across preemption.
"""

from __future__ import annotations

import logging
import time

import llguidance
import tokenizers

from sluice.structured.grammar import (
    GrammarError,
    check_compile_time,
    check_source_size,
    grammar_text,
)
from sluice.structured.spec import StructuredOutputSpec

logger = logging.getLogger("sluice.structured")


class GrammarMatcher:
    """The grammar state of one request: which tokens may come next."""

    def __init__(self, matcher: llguidance.LLMatcher, request_id: str) -> None:
        self.matcher = matcher
        self.request_id = request_id
        # Set when the grammar is complete (only EOS could follow) or broken.
        self.is_terminated = matcher.is_stopped()

    def accept(self, token_id: int) -> None:
        """Advance past one sampled token (the mask allowed it)."""
        if self.is_terminated:
            return
        if not self.matcher.consume_token(token_id):
            # The mask forbids this token; reaching here is a bug, not input.
            logger.error(
                "request %s: grammar refused sampled token %d: %s",
                self.request_id,
                token_id,
                self.matcher.get_error(),
            )
        self.is_terminated = self.matcher.is_stopped()


class CompiledGrammar:
    """A spec built for the model's tokenizer, at its start state."""

    def __init__(self, template: llguidance.LLMatcher) -> None:
        # Never advanced: only copied.
        self._template = template

    def matcher(self, request_id: str) -> GrammarMatcher:
        """A fresh matcher for one request."""
        return GrammarMatcher(self._template.deep_copy(), request_id)


class GrammarCompiler:
    """Compiles specs for the model served: its tokenizer, vocabulary and EOS ids."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer | None,
        vocab_size: int,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.vocab_size = vocab_size
        # None for a model without a tokenizer: its structured requests are refused.
        self._ll_tokenizer = (
            None if tokenizer is None else _ll_tokenizer(tokenizer, vocab_size, eos_token_ids)
        )

    def check(self, spec: StructuredOutputSpec) -> None:
        """What can be refused at once, before a compile. Raises GrammarError."""
        if self._ll_tokenizer is None:
            raise GrammarError("structured output needs the model's tokenizer, which is absent")
        check_source_size(spec)

    def compile(self, spec: StructuredOutputSpec) -> CompiledGrammar:
        """Build `spec`'s grammar; raises GrammarError if it cannot be built or
        is over a limit (sluice.structured.grammar)."""
        self.check(spec)
        started_s = time.thread_time()
        template = llguidance.LLMatcher(self._ll_tokenizer, grammar_text(spec), log_level=0)
        if template.is_error():
            raise GrammarError(f"structured output: {template.get_error()}")
        check_compile_time(time.thread_time() - started_s)
        return CompiledGrammar(template)


def _ll_tokenizer(
    tokenizer: tokenizers.Tokenizer, vocab_size: int, eos_token_ids: frozenset[int]
) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(
        tokenizer.to_str(),
        # The model's vocabulary: ids past the tokenizer's are masked out.
        n_vocab=vocab_size,
        eos_token=sorted(eos_token_ids),
    )
