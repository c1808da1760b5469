"""The engine core: a loop of `step()`s that turns requests into tokens for
many clients at once (continuous batching with chunked prefill).

It owns the scheduler, the requests and the KV cache; what leaves it is a list
of immutable `RequestDelta` values per step. It is driven by one thread: the
engine process's loop, the in-process client's thread, or `LLM.generate`.
"""

from __future__ import annotations

import logging

import torch

from sluice.config import CacheConfig, EngineConfig
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
from sluice.errors import ModelLoadError
from sluice.loader import LoadedModel, load_model
from sluice.loader.loaded_model import torch_dtype
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.structured.matcher import GrammarMatchers

logger = logging.getLogger("sluice.engine")

# Without a budget, the CPU pool takes this much memory (about 1,450 blocks of
# 16 tokens for the embedded model in float32).
DEFAULT_CPU_KV_BYTES = 1 << 30


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None):
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.loaded = loaded or load_model(config.model)
        dtype = torch_dtype(self.loaded.choices.dtype)
        device = torch.device(config.model.device)
        block_size = config.cache.block_size_tokens
        num_blocks = _num_kv_blocks(config.cache, self.loaded.model_config, dtype, device)
        self.max_model_len = self.loaded.max_model_len
        if num_blocks * block_size < self.max_model_len:
            raise ModelLoadError(
                f"the KV cache holds {num_blocks * block_size} tokens, less than one request "
                f"of max_model_len {self.max_model_len}: raise --kv-cache-memory or lower "
                "--max-model-len"
            )
        self.kv = KVCacheManager(
            num_blocks,
            block_size,
            enable_prefix_caching=config.cache.enable_prefix_caching,
            # Anything that changes a block's contents for the same tokens.
            cache_salt=f"{self.loaded.name}\0{dtype}\0{self.loaded.choices.quantization}"
            f"\0{self.loaded.choices.activations}".encode(),
        )
        self.scheduler = Scheduler(
            config.scheduler, self.kv, self.loaded.eos_token_ids, self.max_model_len
        )
        self.runner = ModelRunner(
            self.loaded.model,
            self.loaded.model_config,
            num_blocks=num_blocks,
            block_size_tokens=block_size,
            dtype=dtype,
            device=device,
            eos_token_ids=self.loaded.eos_token_ids,
        )
        # Structured outputs: one matcher per constrained request.
        self.grammars = GrammarMatchers(
            getattr(self.loaded.tokenizer, "backend", None),
            self.loaded.model_config.vocab_size,
            self.loaded.eos_token_ids,
        )
        self.info = EngineReady(
            model_name=self.loaded.name,
            max_model_len=self.max_model_len,
            num_kv_blocks=num_blocks,
            block_size_tokens=block_size,
            vocab_size=self.loaded.model_config.vocab_size,
        )
        logger.info(
            "engine ready: model %s, %s%s on %s with %d threads (%s), max_model_len %d, "
            "%d KV blocks of %d tokens (%d tokens), max_num_batched_tokens %d, max_num_seqs %d",
            self.loaded.name,
            self.loaded.choices.dtype,
            _modes(self.loaded.choices),
            device,
            torch.get_num_threads(),
            self.loaded.choices.reason,
            self.max_model_len,
            num_blocks,
            block_size,
            num_blocks * block_size,
            config.scheduler.max_num_batched_tokens,
            config.scheduler.max_num_seqs,
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


def _modes(choices) -> str:
    """ " + int4 + int8 activations" for the startup line; "" when neither."""
    weights = f" + {choices.quantization}" if choices.quantization else ""
    return weights + (f" + {choices.activations} activations" if choices.activations else "")


def _num_kv_blocks(cache: CacheConfig, model_config, dtype, device) -> int:
    """Size the KV pool from the byte budget, or a share of free device memory."""
    bytes_per_block = kv_cache_bytes_per_block(model_config, cache.block_size_tokens, dtype)
    if cache.kv_cache_memory_bytes is not None:
        budget = cache.kv_cache_memory_bytes
    elif device.type == "cuda":
        free_bytes, _total = torch.cuda.mem_get_info(device)
        budget = int(free_bytes * cache.memory_fraction)
    else:
        budget = DEFAULT_CPU_KV_BYTES
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"the KV cache budget of {budget} bytes holds no block of {bytes_per_block} bytes"
        )
    return int(num_blocks)
