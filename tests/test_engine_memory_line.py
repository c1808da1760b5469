"""The startup line's memory figures against what the engine process really holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.gguf_files import write_tiny_gguf
from tests.model_factory import build_tiny_model

# A fresh process: torch and the library loaded, then the engine built (its
# model loaded and its KV pool allocated) while its resident set is watched.
_ENGINE = """
import json, logging, sys
import psutil, torch
from pathlib import Path
from sluice.config import CacheConfig, EngineConfig, ModelConfig
from sluice.engine.core import EngineCore

lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger("sluice.engine").addHandler(handler)
logging.getLogger("sluice.engine").setLevel(logging.INFO)
process = psutil.Process()
before = process.memory_info().rss
config = EngineConfig(
    model=ModelConfig(model=sys.argv[1], cache_dir=Path(sys.argv[2]), max_model_len=256),
    cache=CacheConfig(kv_cache_memory_bytes=int(sys.argv[3]) if sys.argv[3] != "-" else None),
    multiprocess=False,
)
core = EngineCore(config)
after = process.memory_info().rss
print(json.dumps({"before": before, "after": after,
                  "line": next(line for line in lines if line.startswith("engine ready"))}))
"""
_FIGURES = re.compile(
    r"memory: weights (\d+) MiB, KV reserved (\d+) MiB \(resident as used\), workspace (\d+) MiB"
)
MIB = 1 << 20


def engine_memory(model_path, cache_dir, kv_bytes: str) -> tuple[int, int, int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE, str(model_path), str(cache_dir), kv_bytes],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    weights, kv, workspace = (int(v) * MIB for v in _FIGURES.search(result["line"]).groups())
    return weights, kv, workspace, result["after"] - result["before"]


def test_the_line_accounts_for_what_the_engine_process_holds(tmp_path):
    tiny = build_tiny_model(
        "llama_tied", tmp_path / "tiny", hidden_size=256, intermediate_size=2048, head_dim=64,
        num_hidden_layers=4,
    )  # fmt: skip
    path = write_tiny_gguf(tiny, tmp_path / "Tiny.F32.gguf")
    weights, kv, workspace, grown = engine_memory(path, tmp_path / "cache", str(1024 * MIB))
    assert kv == 1024 * MIB and weights > 0
    # The weights are in and the pool is reserved, not yet written
    # (models/zero_pages.py): the process holds the weights; the step
    # workspace and the native kernels' libraries on top, but none of the pool.
    assert grown >= 0.9 * weights, (grown / MIB, weights / MIB, kv / MIB)
    assert grown <= weights + workspace + 300 * MIB, (grown / MIB, weights / MIB, kv / MIB)
