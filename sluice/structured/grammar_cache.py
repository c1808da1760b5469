"""Compiled grammars by spec, compiled on one worker thread of the engine process.

Compiling a large schema and building its matcher takes a tenth of a second
or more (0.15 s of CPU for a 1 MiB enum over a 49k vocabulary); on the engine
loop that would stall every stream for as long. `GrammarCache.compiled(spec)`
instead returns a future at once. Every request of one spec gets the same
future (the choices of one n>1 request, any later request while the spec is
cached), so a spec compiles once and each request copies the result. A
refusal is cached too: a bad spec sent again costs nothing.

Only the engine loop calls `compiled`; the worker thread only runs `compile`.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from sluice.structured.matcher import CompiledGrammar, GrammarCompiler
from sluice.structured.spec import StructuredOutputSpec

# Distinct specs whose compiled grammar (or refusal) the engine keeps.
COMPILED_GRAMMAR_CACHE_SIZE = 64


class GrammarCache:
    def __init__(self, compiler: GrammarCompiler) -> None:
        # `check` runs at once, on the engine loop: the cheap refusals (no
        # tokenizer, source over the size limit) need no round trip. `compile`
        # runs on the worker thread.
        self.compiler = compiler
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-grammar")
        # Least recently asked first; in-flight futures included.
        self._futures: OrderedDict[StructuredOutputSpec, Future[CompiledGrammar]] = OrderedDict()

    def compiled(self, spec: StructuredOutputSpec) -> Future[CompiledGrammar]:
        """The spec's compiled grammar, now or later (the future raises
        GrammarError for a spec refused). Raises GrammarError for a spec
        refused without compiling."""
        future = self._futures.get(spec)
        if future is not None:
            self._futures.move_to_end(spec)
            return future
        self.compiler.check(spec)
        future = self._executor.submit(self.compiler.compile, spec)
        self._futures[spec] = future
        if len(self._futures) > COMPILED_GRAMMAR_CACHE_SIZE:
            # Requests waiting on an evicted future keep their own reference.
            self._futures.popitem(last=False)
        return future
