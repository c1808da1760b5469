"""The tiers' Prometheus families (sluice/server/observability/tier_metrics.py): vLLM's
names for what vLLM has, sluice's disk series beside them."""

from __future__ import annotations

from sluice.engine.messages import KVTierStats
from sluice.server.observability.tier_metrics import tier_families

STATS = KVTierStats(
    queried_tokens=64,
    hit_tokens=48,
    ram_queried_blocks=4,
    ram_hit_blocks=3,
    ram_evicted_blocks=2,
    ram_bytes=300,
    ram_capacity_bytes=1200,
    transfer_bytes={"pool_to_ram": 10, "ram_to_pool": 20, "disk_to_pool": 30, "pool_to_disk": 40},
    disk_hits=1,
    disk_bad_files=5,
    disk_bytes=999,
)


def samples(prefix: str, stats: KVTierStats | None = STATS) -> dict[tuple[str, str], float]:
    """(sample name, transfer type or "") -> value."""
    return {
        (sample.name, sample.labels.get("transfer_type", "")): sample.value
        for family in tier_families(prefix, stats, "m")
        for sample in family.samples
        if sample.labels["model_name"] == "m"
    }


def test_the_tiers_read_under_vllms_names():
    vllm = samples("vllm")
    assert vllm[("vllm:external_prefix_cache_queries_total", "")] == 64
    assert vllm[("vllm:external_prefix_cache_hits_total", "")] == 48
    assert vllm[("vllm:kv_offload_cpu_block_hit_total", "")] == 3
    assert vllm[("vllm:kv_offload_cpu_block_miss_total", "")] == 1
    assert vllm[("vllm:kv_offload_block_eviction_total", "")] == 2
    assert vllm[("vllm:kv_offload_cpu_cache_usage_perc", "")] == 0.25
    assert vllm[("vllm:kv_offload_total_bytes_total", "ram_to_pool")] == 20


def test_the_disk_tier_has_sluice_names_only():
    assert samples("sluice")[("sluice:kv_disk_bad_files_total", "")] == 5
    assert samples("sluice")[("sluice:kv_disk_usage_bytes", "")] == 999
    assert not [name for name, _ in samples("vllm") if "disk" in name]


def test_no_tiers_no_families():
    assert samples("sluice", None) == {}
