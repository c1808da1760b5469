"""zero_pages.zeros_on_touch: a pool costs resident memory only where written.

Resident memory is read from /proc/self/status (VmRSS) in a fresh
interpreter, so the test process's own heap does not blur it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sluice.models.zero_pages import zeros_on_touch

MIB = 1 << 20
HUGE_PAGE = 2 * MIB

# Allocates a >= 1 GiB bf16 KV pool through allocate_kv_caches (4 layers,
# 4,096 blocks of 16 tokens, 8 KV heads of 128: 4 x 256 MiB), then writes
# one 4 MiB stretch of the first layer's K; prints VmRSS at each stage.
_PROBE = """
import json, torch
from sluice.models.families.registry import parse_hf_config
from sluice.models.attention import allocate_kv_caches

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

config = parse_hf_config({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 1024,
    "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 8, "max_position_embeddings": 128,
})
before = rss()
caches = allocate_kv_caches(config, 4096, 16, torch.bfloat16, "cpu")
allocated = rss()
stretch = caches[0][0, 100:228]  # 128 blocks x 16 x 8 x 128 bf16 = 4 MiB
stretch.fill_(1.0)
written = rss()
print(json.dumps({
    "pool_bytes": sum(c.numel() * c.element_size() for c in caches),
    "stretch_bytes": stretch.numel() * stretch.element_size(),
    "before": before, "allocated": allocated, "written": written,
    "zero_elsewhere": not caches[0][0, :100].any() and not caches[3].any(),
}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=root, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_one_gib_pool_is_not_resident_when_allocated(probe):
    assert probe["pool_bytes"] >= 1 << 30
    assert probe["allocated"] - probe["before"] < 32 * MIB


def test_writing_a_stretch_makes_about_that_stretch_resident(probe):
    grown = probe["written"] - probe["allocated"]
    # At least the stretch; at most one huge page more at either end.
    assert probe["stretch_bytes"] <= grown <= probe["stretch_bytes"] + 2 * HUGE_PAGE + MIB


def test_the_pool_reads_zero_where_it_was_not_written(probe):
    assert probe["zero_elsewhere"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.float32])
def test_a_tensor_reads_zero_and_keeps_what_is_written(dtype):
    pool = zeros_on_touch((2, 5, 3), dtype, "cpu")
    assert pool.shape == (2, 5, 3) and pool.dtype == dtype and pool.is_contiguous()
    assert not pool.any()
    pool[1, 4, 2] = 7
    assert pool[1, 4, 2].item() == 7 and pool.sum().item() == 7


def test_the_tensor_outlives_every_other_reference_to_its_memory():
    pool = zeros_on_touch((1024, 1024), torch.float32, "cpu")
    view = pool[3]
    del pool
    view.fill_(2.0)  # the mapping is still there: no crash, the values stay
    assert view.sum().item() == 2.0 * 1024


def test_an_empty_shape_gives_an_empty_tensor():
    assert zeros_on_touch((2, 0, 4), torch.bfloat16, "cpu").shape == (2, 0, 4)
