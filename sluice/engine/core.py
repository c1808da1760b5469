"""The engine core: a loop of `step()`s that turns requests into tokens for
many clients at once (continuous batching with chunked prefill).

It owns the scheduler, the requests and the KV cache; what leaves it is a list
of immutable `RequestDelta` values per step (and, from `take_errors`, the
requests that failed after they were added). It is driven by one thread: the
engine process's loop, the in-process client's thread, or `LLM.generate`.

Grammars of structured requests compile on a worker thread of their own
(`sluice.structured.grammar_cache`): the loop never stalls on one. Such a
request waits outside the scheduler until its grammar is ready, then joins
the waiting queue like any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from sluice.config import EngineConfig
from sluice.engine.engine_request import EngineRequest, Generation
from sluice.engine.engine_spans import engine_spans
from sluice.engine.grammar_queue import GrammarQueue
from sluice.engine.indent_tokens import IndentTokens
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.kv_tier_setup import build_tiers
from sluice.engine.kv_tiers import tier_stats
from sluice.engine.messages import (
    AbortRequests,
    AddRequest,
    EngineInput,
    EngineReady,
    EngineStatsSnapshot,
    ResetPrefixCache,
    Shutdown,
)
from sluice.engine.outputs import EngineError, RequestDelta
from sluice.engine.request import Request, RequestStatus
from sluice.engine.runner import ModelRunner
from sluice.engine.scheduler import Scheduler
from sluice.engine.speculation import Speculator, speculation_stats
from sluice.engine.startup import (
    bytes_per_block_of,
    cache_salt,
    fit_max_model_len,
    kv_dtype_of,
    num_kv_blocks,
    num_state_slots,
    prefix_caching_blocker,
    speculation_blocker,
    startup_line,
    without_prefix_caching,
)
from sluice.engine.state_slots import StateSlotPool
from sluice.loader import LoadedModel, load_model
from sluice.loader.loaded_model import torch_dtype
from sluice.structured.grammar_cache import GrammarCache
from sluice.structured.matcher import CompiledGrammar, GrammarCompiler

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

logger = logging.getLogger("sluice.engine")

# With nothing but compiling grammars to wait for, a step waits this long for
# one before it returns (so the loop still reads its inputs that often).
GRAMMAR_WAIT_S = 0.01


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel | None = None,
        tracer: Tracer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """`tracer`: where traced requests' spans go (default: the OTLP
        endpoint of `config`, if any; none without one). `clock`: seconds,
        for the step times speculation weighs its drafts by."""
        self.config = config
        self._clock = clock
        # Traced requests' queue, prefill and decode spans; None: tracing off.
        self.spans = engine_spans(tracer, config.otlp_traces_endpoint)
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.loaded = loaded or load_model(config.model)
        self.max_model_len = self.loaded.max_model_len
        # 1. Size the KV pool.
        dtype = torch_dtype(self.loaded.choices.dtype)
        device = torch.device(config.model.device)
        if (blocker := prefix_caching_blocker(config, self.loaded, dtype)) is not None:
            logger.warning("%s", blocker)  # a hybrid whose state snapshots would not pay
            self.config = config = without_prefix_caching(config)
        if (fitted := fit_max_model_len(config, self.loaded, dtype, device)) is not None:
            logger.warning(
                "max_model_len %d: the model's own %d does not fit this machine's memory "
                "(pass --max-model-len to choose)", fitted, self.loaded.max_model_len,
            )  # fmt: skip
            # The core owns its loaded model; every reader below sees the fitted length.
            self.loaded.max_model_len = self.max_model_len = fitted
        num_blocks = num_kv_blocks(config, self.loaded, dtype, device)
        # 2. Build the parts.
        self._build(num_blocks, dtype, device)
        # 3. Say what was built.
        self.info = EngineReady(
            model_name=self.loaded.name,
            max_model_len=self.max_model_len,
            num_kv_blocks=num_blocks,
            block_size_tokens=config.cache.block_size_tokens,
            vocab_size=self.loaded.model_config.vocab_size,
            kernel_plan=self.loaded.kernel_plan,
        )
        logger.info("%s", startup_line(config, self.loaded, device, num_blocks, dtype))

    def _build(self, num_blocks: int, dtype: torch.dtype, device: torch.device) -> None:
        config, loaded = self.config, self.loaded
        block_size = config.cache.block_size_tokens
        # A block's bytes over every layer, for the written-bytes gauge.
        self._kv_block_bytes = bytes_per_block_of(config, loaded, dtype)
        self.kv = KVCacheManager(
            num_blocks,
            block_size,
            enable_prefix_caching=config.cache.enable_prefix_caching,
            cache_salt=cache_salt(loaded, dtype, kv_dtype_of(config, dtype)),
        )
        # Speculative decoding (n-gram drafts verified in the step); None: off,
        # as asked or where verifying would change outputs (startup.py).
        self.speculator = None
        if config.speculative_config is not None and speculation_blocker(loaded) is None:
            # Lookups follow re-indented copies where the vocabulary has
            # indentation tokens (a model loaded without a tokenizer: none).
            tokenizer = loaded.tokenizer
            indents = None
            if tokenizer is not None:
                indents = IndentTokens.from_vocabulary(tokenizer.vocab_size, tokenizer.token_bytes)
            self.speculator = Speculator(config.speculative_config, loaded.step_seconds, indents)
        # Hybrid models: one recurrent-state slot per seat; None for the others.
        num_slots = num_state_slots(config, loaded)
        states = StateSlotPool(num_slots) if num_slots else None
        self.scheduler = Scheduler(
            config.scheduler, self.kv, loaded.eos_token_ids, self.max_model_len, self.speculator,
            states,
        )  # fmt: skip
        self.runner = ModelRunner(
            loaded.model,
            loaded.model_config,
            num_blocks=num_blocks,
            block_size_tokens=block_size,
            dtype=dtype,
            kv_dtype=kv_dtype_of(config, dtype),
            device=device,
            eos_token_ids=loaded.eos_token_ids,
            num_state_slots=num_slots,
            state_snapshots=config.cache.enable_prefix_caching,
        )
        # Prefix-cache tiers below the pool (host RAM, disk); None: the pool only.
        self.tiers = build_tiers(config, loaded, dtype, self.runner.kv_caches)
        self.kv.tier = self.tiers
        # Structured outputs: grammars compile off the loop; a request waits
        # for its grammar in `awaiting_grammar`, outside the scheduler.
        self.grammars = GrammarCache(
            GrammarCompiler(
                getattr(loaded.tokenizer, "backend", None),
                loaded.model_config.vocab_size,
                loaded.eos_token_ids,
            )
        )
        self.awaiting_grammar = GrammarQueue()
        # Requests that failed after add_request returned (a refused grammar).
        self._errors: list[EngineError] = []

    def add_request(self, request: EngineRequest) -> None:
        """Queue a generation request; a structured one first waits for its
        grammar. Raises ValueError for a request the engine can never run (a
        pooling one; a grammar refused at once is a GrammarError, one of those;
        one refused later comes out of `take_errors`). Its spans continue
        `request.trace_context` (with tracing on)."""
        request_id, payload = request.request_id, request.payload
        if not isinstance(payload, Generation):
            raise ValueError(f"{self.loaded.name} generates; it does not embed or score")
        running = Request(request_id, list(payload.prompt_token_ids), payload.params)
        if request_id in self.awaiting_grammar:
            raise ValueError(f"request id {request_id!r} is already live")
        self.scheduler.check_admissible(running)
        spec = payload.params.structured_output
        if spec is None:
            self.scheduler.add_request(running)
        elif (grammar := self.grammars.compiled(spec)).done():
            self._admit(running, grammar)  # compiled before: no need to wait a step
        else:
            self.awaiting_grammar.add(running, grammar)
        if self.spans is not None:
            self.spans.on_add(request_id, request.trace_context, len(payload.prompt_token_ids))

    def _admit(self, request: Request, grammar: Future[CompiledGrammar]) -> None:
        """Give a request its matcher and queue it. Raises the grammar's error."""
        request.grammar = grammar.result().matcher(request.request_id)
        self.scheduler.add_request(request)

    def _admit_compiled(self) -> None:
        """Requests whose grammar is done join the scheduler or fail; with
        nothing else to run, first wait a little for one."""
        if not self.awaiting_grammar:
            return
        wait_s = 0.0 if self.scheduler.has_unfinished_requests() else GRAMMAR_WAIT_S
        for request, grammar in self.awaiting_grammar.take_done(wait_s):
            try:
                self._admit(request, grammar)
            except ValueError as error:
                self._errors.append(EngineError(request.request_id, str(error)))

    def take_errors(self) -> list[EngineError]:
        """The requests that failed since the last call, each reported once."""
        errors, self._errors = self._errors, []
        return errors

    def abort_requests(self, request_ids: list[str]) -> list[RequestDelta]:
        deltas = self.scheduler.abort_requests(request_ids)
        for request in self.awaiting_grammar.remove(request_ids):
            request.status = RequestStatus.FINISHED_ABORTED
            deltas.append(request.take_delta())
        if self.spans is not None:
            self.spans.on_deltas(deltas)
        return deltas

    def handle(
        self, message: EngineInput, deltas: list[RequestDelta], errors: list[EngineError]
    ) -> bool:
        """Apply one input of a client (both drivers, the engine process and
        the in-process thread, call this); what it yields goes into `deltas`
        and `errors`. False when the input is Shutdown."""
        match message:
            case AddRequest(request):
                try:
                    self.add_request(request)
                except ValueError as error:
                    errors.append(EngineError(request.request_id, str(error)))
            case AbortRequests(request_ids):
                deltas.extend(self.abort_requests(request_ids))
            case ResetPrefixCache():
                self.kv.reset_prefix_cache()
                if self.tiers is not None:
                    self.tiers.clear_ram()
            case Shutdown():
                if self.tiers is not None:
                    self.tiers.close()  # the disk tier's queued writes
                return False
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.awaiting_grammar)

    def step(self) -> list[RequestDelta]:
        """One step of the batch; a request whose grammar failed meanwhile
        comes out of `take_errors`."""
        # 0. Requests whose grammar compiled meanwhile join the waiting queue.
        self._admit_compiled()
        # 1. Choose who runs and how many tokens each computes.
        if self.spans is not None:
            self.spans.on_step_start()
        start = self._clock()
        plan = self.scheduler.schedule()
        self._move_blocks()
        if not plan.scheduled:
            return []
        # 2. Run the model; sample one token for each request whose prompt is done.
        output = self.runner.execute(plan)
        # 3. Advance requests, free the finished, emit one delta per request.
        deltas = self.scheduler.update(
            plan, output.sampled, output.prompt_logprobs, output.draft_samples
        )
        self._move_blocks()
        # The whole step (drafting, verifying, accepting) prices speculation's rows.
        if self.speculator is not None and (rows := plan.decode_rows()) is not None:
            self.speculator.costs.observe(*rows, self._clock() - start)
        if self.spans is not None:  # 4. Traced requests' phases.
            self.spans.on_step(plan, deltas)
        return deltas

    def _move_blocks(self) -> None:
        """Apply the pool's block moves to and from the cache tiers, in order,
        before the next forward pass reads or writes those blocks."""
        if self.tiers is not None:
            self.tiers.apply(self.kv.take_transfers())

    def stats(self) -> EngineStatsSnapshot:
        return EngineStatsSnapshot(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting + len(self.awaiting_grammar),
            kv_cache_usage=self.kv.usage,
            kv_cache_written_bytes=self.kv.num_written_blocks * self._kv_block_bytes,
            prefix_cache_queried_tokens=self.kv.num_queried_tokens,
            prefix_cache_hit_tokens=self.kv.num_hit_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            kv_tiers=tier_stats(self.tiers),
            **speculation_stats(self.speculator),
        )
