"""The engine core: a loop of `step()`s that turns requests into tokens for
many clients at once (continuous batching with chunked prefill).

It owns the scheduler, the requests and the KV cache; what leaves it is a list
of immutable `RequestDelta` values per step. It is driven by one thread: the
engine process's loop, the in-process client's thread, or `LLM.generate`.
"""

from __future__ import annotations

import logging

import torch

from sluice.config import EngineConfig
from sluice.engine.kv_cache import KVCacheManager
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
from sluice.engine.request import Request
from sluice.engine.runner import ModelRunner
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.scheduler import Scheduler
from sluice.engine.startup import cache_salt, num_kv_blocks, startup_line
from sluice.loader import LoadedModel, load_model
from sluice.loader.loaded_model import torch_dtype
from sluice.structured.matcher import GrammarMatchers

logger = logging.getLogger("sluice.engine")


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None):
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.loaded = loaded or load_model(config.model)
        self.max_model_len = self.loaded.max_model_len
        # 1. Size the KV pool.
        dtype = torch_dtype(self.loaded.choices.dtype)
        device = torch.device(config.model.device)
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
        )
        logger.info("%s", startup_line(config, self.loaded, device, num_blocks))

    def _build(self, num_blocks: int, dtype: torch.dtype, device: torch.device) -> None:
        config, loaded = self.config, self.loaded
        block_size = config.cache.block_size_tokens
        self.kv = KVCacheManager(
            num_blocks,
            block_size,
            enable_prefix_caching=config.cache.enable_prefix_caching,
            cache_salt=cache_salt(loaded, dtype),
        )
        self.scheduler = Scheduler(
            config.scheduler, self.kv, loaded.eos_token_ids, self.max_model_len
        )
        self.runner = ModelRunner(
            loaded.model,
            loaded.model_config,
            num_blocks=num_blocks,
            block_size_tokens=block_size,
            dtype=dtype,
            device=device,
            eos_token_ids=loaded.eos_token_ids,
        )
        # Structured outputs: one matcher per constrained request.
        self.grammars = GrammarMatchers(
            getattr(loaded.tokenizer, "backend", None),
            loaded.model_config.vocab_size,
            loaded.eos_token_ids,
        )

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        # Raises ValueError for a request the engine can never run (a grammar
        # that does not compile is a GrammarError, one of those).
        request = Request(request_id, list(prompt_token_ids), params)
        if params.structured_output is not None:
            request.grammar = self.grammars.matcher(params.structured_output, request_id)
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> list[RequestDelta]:
        return self.scheduler.abort_requests(request_ids)

    def handle(
        self, message: EngineInput, deltas: list[RequestDelta], errors: list[EngineError]
    ) -> bool:
        """Apply one input of a client (both drivers, the engine process and
        the in-process thread, call this); what it yields goes into `deltas`
        and `errors`. False when the input is Shutdown."""
        match message:
            case AddRequest(request_id, prompt_token_ids, params):
                try:
                    self.add_request(request_id, prompt_token_ids, params)
                except ValueError as error:
                    errors.append(EngineError(request_id, str(error)))
            case AbortRequests(request_ids):
                deltas.extend(self.abort_requests(request_ids))
            case ResetPrefixCache():
                self.kv.reset_prefix_cache()
            case Shutdown():
                return False
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestDelta]:
        # 1. Choose who runs and how many tokens each computes.
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            return []
        # 2. Run the model; sample one token for each request whose prompt is done.
        output = self.runner.execute(plan)
        # 3. Advance requests, free the finished, emit one delta per request.
        return self.scheduler.update(plan, output.sampled, output.prompt_logprobs)

    def stats(self) -> EngineStatsSnapshot:
        return EngineStatsSnapshot(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=self.kv.usage,
            prefix_cache_queried_tokens=self.kv.num_queried_tokens,
            prefix_cache_hit_tokens=self.kv.num_hit_tokens,
            num_preemptions=self.scheduler.num_preemptions,
        )
