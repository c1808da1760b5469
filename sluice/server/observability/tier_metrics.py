"""Prometheus families of the prefix cache's tiers below the KV pool
(sluice/engine/kv_tiers.py), read from the engine's stats at scrape time.

Under vLLM's names where vLLM has the series, and sluice's beside them:
- `external_prefix_cache_queries` / `_hits`: prompt tokens looked up in the
  tiers past the pool's own blocks, and found (vLLM's KV-connector pair;
  `prefix_cache_hits` already counts them too, as `cached_tokens` does);
- `kv_offload_cpu_block_lookup` / `_hit` / `_miss`, `kv_offload_block_eviction`,
  `kv_offload_cpu_cache_usage_perc`: the RAM tier (vLLM's CPU offloading);
- `kv_offload_total_bytes{transfer_type}`: bytes copied, by direction
  (pool_to_ram, ram_to_pool, disk_to_pool, pool_to_disk).
The disk tier has no vLLM twin: `sluice:kv_disk_*` only.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sluice.engine.messages import KVTierStats


def tier_families(prefix: str, stats: KVTierStats | None, model_name: str) -> Iterator[Metric]:
    """The tiers' families under `prefix` ("sluice" or "vllm"); none without tiers."""
    if stats is None:
        return

    def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(f"{prefix}:{name}", documentation, labels=["model_name"])
        family.add_metric([model_name], value)
        return family

    yield counter("external_prefix_cache_queries",
                  "Prompt tokens looked up in the RAM and disk tiers.", stats.queried_tokens)  # fmt: skip
    yield counter("external_prefix_cache_hits",
                  "Prompt tokens found in the RAM and disk tiers.", stats.hit_tokens)  # fmt: skip
    yield counter("kv_offload_cpu_block_lookup",
                  "KV blocks looked up in the RAM tier.", stats.ram_queried_blocks)  # fmt: skip
    yield counter("kv_offload_cpu_block_hit", "KV blocks found in the RAM tier.",
                  stats.ram_hit_blocks)  # fmt: skip
    yield counter("kv_offload_cpu_block_miss", "KV blocks not found in the RAM tier.",
                  stats.ram_queried_blocks - stats.ram_hit_blocks)  # fmt: skip
    yield counter("kv_offload_block_eviction",
                  "KV blocks the RAM tier dropped for room.", stats.ram_evicted_blocks)  # fmt: skip
    usage = GaugeMetricFamily(f"{prefix}:kv_offload_cpu_cache_usage_perc",
                              "RAM tier bytes held over its bound, 0 to 1.",
                              labels=["model_name"])  # fmt: skip
    bound = stats.ram_capacity_bytes
    usage.add_metric([model_name], stats.ram_bytes / bound if bound else 0.0)
    yield usage
    moved = CounterMetricFamily(f"{prefix}:kv_offload_total_bytes",
                                "Bytes of KV blocks copied between the pool and the tiers.",
                                labels=["model_name", "transfer_type"])  # fmt: skip
    for direction, num_bytes in sorted(stats.transfer_bytes.items()):
        moved.add_metric([model_name, direction], num_bytes)
    yield moved
    if prefix == "sluice":
        yield from _disk_families(stats, counter, model_name)


def _disk_families(stats: KVTierStats, counter, model_name: str) -> Iterator[Metric]:
    yield counter("kv_disk_hits", "KV blocks read from the disk tier.", stats.disk_hits)
    yield counter("kv_disk_misses", "KV blocks not found (or unusable) in the disk tier.",
                  stats.disk_misses)  # fmt: skip
    yield counter("kv_disk_writes", "KV block files written.", stats.disk_writes)
    yield counter("kv_disk_write_failures",
                  "KV block writes that failed (full disk, read-only folder) or were dropped.",
                  stats.disk_write_failures)  # fmt: skip
    yield counter("kv_disk_bad_files",
                  "Torn, corrupted or foreign KV block files ignored and removed.",
                  stats.disk_bad_files)  # fmt: skip
    yield counter("kv_disk_evicted_files",
                  "KV block files removed to stay within --kv-cache-dir-bytes.",
                  stats.disk_evicted_files)  # fmt: skip
    usage = GaugeMetricFamily("sluice:kv_disk_usage_bytes",
                              "Bytes in --kv-cache-dir, as last counted.",
                              labels=["model_name"])  # fmt: skip
    usage.add_metric([model_name], stats.disk_bytes)
    yield usage
