"""Which replica serves a request: by load, and by where its prompt's prefix is cached.

Pure bookkeeping on the event loop, no I/O: the data-parallel client asks
`route` for a replica, then reports each request's progress (`on_delta`) and
end (`finish`).

- **Load** is a replica's outstanding tokens: for each of its open requests,
  the prompt tokens not yet prefilled (the whole prompt until the first
  delta) plus the max_tokens not yet generated. Request counts would treat a
  4,000-token prompt like a 4-token one.
- **Prefix affinity.** A replica keeps the KV of full prompt blocks it
  computed (engine/kv_cache.py), so a prompt sharing its first blocks with
  one served recently is cheaper there. Each routed prompt's first blocks
  (up to `AFFINITY_MAX_BLOCKS`) are named by a chained hash, each depth
  remembered with its replica (an LRU of `max_prefixes`). A new prompt goes
  to the replica holding its deepest known prefix, unless that replica's
  load exceeds the least loaded one's by more than the prefix tokens it
  would save; otherwise to the least loaded (ties: fewest routed so far).
- A replica that restarts has an empty cache: `forget` drops its prefixes
  (an epoch per replica, so nothing is walked).

Invariant: each open request counts in exactly one replica's load, from
`route` until `finish` (idempotent).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.engine.outputs import RequestDelta

# Blocks of a prompt considered for affinity (2,048 tokens at 16 per block).
AFFINITY_MAX_BLOCKS = 128
MAX_PREFIXES = 100_000


@dataclass(slots=True)
class _OpenRequest:
    replica: int
    num_prompt_tokens_left: int
    num_output_tokens_left: int

    @property
    def num_outstanding_tokens(self) -> int:
        return self.num_prompt_tokens_left + self.num_output_tokens_left


@dataclass(slots=True)
class ReplicaLoad:
    num_outstanding_tokens: int = 0
    num_requests_routed: int = 0
    num_routed_by_prefix: int = 0


class ReplicaRouter:
    def __init__(self, num_replicas: int, block_size_tokens: int, max_prefixes: int = MAX_PREFIXES):
        assert num_replicas >= 1 and block_size_tokens >= 1, "a router needs replicas and blocks"
        self.block_size_tokens = block_size_tokens
        self.max_prefixes = max_prefixes
        self.loads = [ReplicaLoad() for _ in range(num_replicas)]
        self._epochs = [0] * num_replicas
        self._open: dict[str, _OpenRequest] = {}
        # Chained hash of a prompt's first k blocks -> (replica, its epoch then).
        self._prefixes: OrderedDict[int, tuple[int, int]] = OrderedDict()

    # -- routing ---------------------------------------------------------------

    def route(
        self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
        healthy: Sequence[int],
    ) -> int:  # fmt: skip
        """The replica (one of `healthy`) for this request; counts it there."""
        assert healthy, "route needs a healthy replica"
        assert request_id not in self._open, f"request {request_id} routed twice"
        prefix_hashes = self._prefix_hashes(prompt_token_ids)
        replica, is_by_prefix = self._choose(prefix_hashes, healthy)
        self._remember(prefix_hashes, replica)
        load = self.loads[replica]
        load.num_requests_routed += 1
        load.num_routed_by_prefix += is_by_prefix
        request = _OpenRequest(replica, len(prompt_token_ids), max_tokens)
        load.num_outstanding_tokens += request.num_outstanding_tokens
        self._open[request_id] = request
        return replica

    def replica_of(self, request_id: str) -> int | None:
        request = self._open.get(request_id)
        return None if request is None else request.replica

    def _choose(self, prefix_hashes: list[int], healthy: Sequence[int]) -> tuple[int, bool]:
        least = min(healthy, key=self._least_loaded_key)
        cached, num_cached_blocks = self._deepest_cached(prefix_hashes, healthy)
        if cached is None or cached == least:
            return least, cached is not None
        extra_load = self.loads[cached].num_outstanding_tokens
        extra_load -= self.loads[least].num_outstanding_tokens
        if extra_load <= num_cached_blocks * self.block_size_tokens:
            return cached, True
        return least, False

    def _least_loaded_key(self, replica: int) -> tuple[int, int]:
        load = self.loads[replica]
        return load.num_outstanding_tokens, load.num_requests_routed

    # -- progress ----------------------------------------------------------------

    def on_delta(self, delta: RequestDelta) -> None:
        """A request's tokens arrived: its prompt is prefilled, its output shorter."""
        request = self._open.get(delta.request_id)
        if request is None:
            return
        if delta.is_finished:
            self.finish(delta.request_id)
            return
        num_generated = min(len(delta.new_token_ids), request.num_output_tokens_left)
        done = request.num_prompt_tokens_left + num_generated
        request.num_prompt_tokens_left = 0
        request.num_output_tokens_left -= num_generated
        self.loads[request.replica].num_outstanding_tokens -= done

    def finish(self, request_id: str) -> None:
        """The request ended (finished, failed or aborted); idempotent."""
        request = self._open.pop(request_id, None)
        if request is not None:
            self.loads[request.replica].num_outstanding_tokens -= request.num_outstanding_tokens

    def forget(self, replica: int) -> None:
        """The replica lost its cache (it restarted): its prefixes no longer count."""
        self._epochs[replica] += 1

    # -- prefixes ----------------------------------------------------------------

    def _prefix_hashes(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """Chained hashes of the prompt's full blocks a replica could reuse.

        The engine always computes a prompt's last token, so only blocks
        before it count.
        """
        size = self.block_size_tokens
        num_blocks = min((len(prompt_token_ids) - 1) // size, AFFINITY_MAX_BLOCKS)
        hashes = []
        parent = 0
        for start in range(0, num_blocks * size, size):
            parent = hash((parent, *prompt_token_ids[start : start + size]))
            hashes.append(parent)
        return hashes

    def _deepest_cached(
        self, prefix_hashes: list[int], healthy: Sequence[int]
    ) -> tuple[int | None, int]:
        """The healthy replica holding the longest known prefix, and its depth in blocks."""
        for depth in range(len(prefix_hashes), 0, -1):
            entry = self._prefixes.get(prefix_hashes[depth - 1])
            if entry is None:
                continue
            replica, epoch = entry
            if epoch == self._epochs[replica] and replica in healthy:
                return replica, depth
        return None, 0

    def _remember(self, prefix_hashes: list[int], replica: int) -> None:
        entry = (replica, self._epochs[replica])
        for prefix_hash in prefix_hashes:
            self._prefixes[prefix_hash] = entry
            self._prefixes.move_to_end(prefix_hash)
        while len(self._prefixes) > self.max_prefixes:
            self._prefixes.popitem(last=False)
