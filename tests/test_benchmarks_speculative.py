"""benchmarks/speculative.py's parts on the tiny model: a run times one
stream and counts what speculation drafted and accepted; the summary puts
both sides of a task on one line. (Its figures mean nothing here.)"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

from sluice.config import CacheConfig, EngineConfig, SpeculativeConfig
from sluice.engine.core import EngineCore
from sluice.engine.sampling_params import SamplingParams
from sluice.models.attention import kv_cache_bytes_per_block

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
speculative = importlib.import_module("speculative")


def make_core(loaded, speculative: SpeculativeConfig | None) -> EngineCore:
    bytes_per_block = kv_cache_bytes_per_block(loaded.model_config, 4, torch.float32)
    config = EngineConfig(
        cache=CacheConfig(block_size_tokens=4, kv_cache_memory_bytes=512 * bytes_per_block),
        multiprocess=False,
        speculative_config=speculative,
    )
    return EngineCore(config, loaded=loaded)


def test_a_run_counts_tokens_steps_and_drafts_and_the_summary_compares_sides(tiny_loaded):
    prompt = [5, 6, 7, 8, 9, 10] * 8
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    off = speculative.run_one(make_core(tiny_loaded, None), prompt, params, "off")
    core = make_core(tiny_loaded, SpeculativeConfig(num_speculative_tokens=4))
    on = [speculative.run_one(core, prompt, params, f"on{i}") for i in range(2)]
    assert off.num_tokens == on[0].num_tokens == 40 and off.num_drafted == 0
    assert on[0].token_ids == on[1].token_ids == off.token_ids
    # Counted per run, not since the core started.
    assert on[0].num_drafted == on[1].num_drafted > 0
    assert on[0].num_steps < off.num_steps
    line = speculative.summary("copy", [off, off], on)
    assert line.startswith("copy ") and "same tokens: yes" in line
    assert f"({2 * on[0].num_accepted}/{2 * on[0].num_drafted})" in line


def test_the_copy_prompt_holds_about_a_thousand_tokens_of_source():
    class Words:
        def encode(self, text: str) -> list[str]:
            return text.split()

    prompt = speculative.copy_prompt(Words())
    assert "num_blocks" in prompt and 1000 <= len(prompt.split()) < 1100
