"""Typed messages between the engine client and the engine process (msgpack).

    client ──EngineInput (AddRequest | AbortRequests | ResetPrefixCache
                          | Shutdown)──▶ engine
    client ◀──EngineOutput (EngineReady | StepOutputs | EngineFailed)── engine process

Every message is a value: decoded into fresh objects on the receiving side.
"""

from __future__ import annotations

import msgspec

from sluice.engine.engine_request import EngineRequest
from sluice.engine.outputs import EngineError, RequestDelta
from sluice.engine.pooling_params import PoolingSpec


class AddRequest(msgspec.Struct, frozen=True, tag="add"):
    """Queue one engine request (generation or pooling: its payload says)."""

    request: EngineRequest


class AbortRequests(msgspec.Struct, frozen=True, tag="abort"):
    request_ids: list[str]


class ResetPrefixCache(msgspec.Struct, frozen=True, tag="reset_prefix_cache"):
    pass


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown"):
    pass


EngineInput = AddRequest | AbortRequests | ResetPrefixCache | Shutdown


class EngineReady(msgspec.Struct, frozen=True, tag="ready"):
    model_name: str
    max_model_len: int
    num_kv_blocks: int
    block_size_tokens: int
    vocab_size: int
    # The kernel plan chosen at load, one line (sluice/models/kernel_plan.py);
    # "" where none applies (another device, batch-invariant mode).
    kernel_plan: str = ""
    # A pooling model's description (sluice/engine/pooling_core.py); None: generation.
    pooling: PoolingSpec | None = None


class KVTierStats(msgspec.Struct, frozen=True):
    """The prefix cache's tiers below the pool (sluice/engine/kv_tiers.py),
    since the engine started unless said otherwise."""

    # Tokens looked up in the tiers (past the pool's own blocks), and found.
    queried_tokens: int = 0
    hit_tokens: int = 0
    # The RAM tier: blocks asked for and found there, blocks it dropped (LRU),
    # bytes it holds now and its bound (0: no RAM tier).
    ram_queried_blocks: int = 0
    ram_hit_blocks: int = 0
    ram_evicted_blocks: int = 0
    ram_bytes: int = 0
    ram_capacity_bytes: int = 0
    # Bytes copied, by direction ("pool_to_ram", "ram_to_pool", "disk_to_pool",
    # "pool_to_disk").
    transfer_bytes: dict[str, int] = {}
    # The disk tier (all 0 without --kv-cache-dir): reads found and not, files
    # written, writes failed or dropped, bad files ignored (torn, corrupted,
    # foreign), files evicted by the bound, the folder's bytes as last counted.
    disk_hits: int = 0
    disk_misses: int = 0
    disk_writes: int = 0
    disk_write_failures: int = 0
    disk_bad_files: int = 0
    disk_evicted_files: int = 0
    disk_bytes: int = 0


class EngineStatsSnapshot(msgspec.Struct, frozen=True):
    """The engine's state after a step, for metrics: the one description of it."""

    num_running: int = 0
    num_waiting: int = 0
    # Fraction of KV blocks held by requests, 0.0 .. 1.0.
    kv_cache_usage: float = 0.0
    # Bytes of the KV blocks ever handed out: on a CPU, the pool's resident
    # memory (its pages are committed as first written, models/zero_pages.py).
    kv_cache_written_bytes: int = 0
    # Since the engine started: prompt tokens looked up in the prefix cache
    # at a request's first admission (not its returns after preemption), and
    # those found there.
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    # Since the engine started: running requests preempted for KV blocks.
    num_preemptions: int = 0
    # Since the engine started, with speculative decoding on (vLLM's
    # vllm:spec_decode_*): steps in which a request verified a draft, the
    # drafted tokens, those accepted, and [i] those accepted at draft position i.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()
    # The prefix cache's RAM and disk tiers; None: none on.
    kv_tiers: KVTierStats | None = None


class StepOutputs(msgspec.Struct, frozen=True, tag="outputs"):
    # One batch per engine step (or per heartbeat, with no deltas).
    deltas: list[RequestDelta]
    # Requests the engine refused or failed, each reported once.
    errors: list[EngineError]
    stats: EngineStatsSnapshot


class EngineFailed(msgspec.Struct, frozen=True, tag="failed"):
    # The engine is going down: startup failed or a step raised.
    message: str


class EngineAlive(msgspec.Struct, frozen=True, tag="alive"):
    # Progress since the last beat: decoder layers mid-step, or the loading
    # thread's work before the first (engine/progress_beat.py).
    progress: int


EngineOutput = EngineReady | StepOutputs | EngineFailed | EngineAlive

input_encoder = msgspec.msgpack.Encoder()
input_decoder = msgspec.msgpack.Decoder(EngineInput)
output_encoder = msgspec.msgpack.Encoder()
output_decoder = msgspec.msgpack.Decoder(EngineOutput)
