"""Every native kernel under AddressSanitizer (issue 40: int8_gemm.c read up
to 252 bytes past the compensation for widths off 64, which no value test
could see).

The library is rebuilt with -fsanitize=address into a temporary cache
folder, where the loader finds it under its usual name; a fresh process
with libasan preloaded (Python itself is not instrumented, so the runtime
must come first) then drives every exported kernel through its wrapper at
awkward sizes (tests/native_kernel_driver.py). A read or write past any
buffer aborts that process with ASan's report, which fails this test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sluice
from sluice.models.native import abi, find_compiler
from sluice.models.native.build import build_library, library_path

DRIVER = Path(__file__).with_name("native_kernel_driver.py")
SANITIZE = ("-fsanitize=address", "-fno-omit-frame-pointer")
# Each `*_available` gate -> the kernels that cannot run where it says no.
GATED = {
    "decode_attention_amx_available": {"decode_attention_amx_bf16"},
    "prefill_attention_available": {"prefill_attention_bf16"},
    "prefill_attention_amx_available": {"prefill_attention_amx_bf16"},
    "int8_amx_available": {"int8_amx_gemm_bf16"},
    "qblock_gemm_available": {
        "qblock_super_bytes", "qblock_gemm", "qblock_linear", "qblock_rows",
    },
    "int8_gemm_available": {
        "int8_packed_bytes", "pack_int8_weights", "int8_gemm_bf16", "int8_linear_bf16",
        "decoder_layer_rows_bf16",
    },
}  # fmt: skip


def asan_runtime(compiler: str | None) -> str | None:
    """The compiler's libasan.so, or None where it has none."""
    if compiler is None:
        return None
    done = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True)
    path = done.stdout.strip()
    return path if done.returncode == 0 and os.path.isabs(path) else None


requires_asan = pytest.mark.skipif(
    asan_runtime(find_compiler()) is None, reason="no C compiler with AddressSanitizer here"
)


@requires_asan
def test_every_kernel_runs_clean_under_address_sanitizer(tmp_path, monkeypatch):
    compiler = find_compiler()
    assert compiler is not None
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path))
    target = library_path(compiler)
    build_library(compiler, target, SANITIZE)
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(sluice.__file__).parents[1]),  # the sources built above
        "SLUICE_CACHE_DIR": str(tmp_path),
        "LD_PRELOAD": asan_runtime(compiler),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0",
        "OMP_NUM_THREADS": "2",
    }
    env.pop("SLUICE_NATIVE_KERNELS", None)
    done = subprocess.run(
        [sys.executable, str(DRIVER)], env=env, capture_output=True, text=True, timeout=900
    )
    report = done.stderr[done.stderr.find("ERROR: AddressSanitizer") :][:4000]
    assert done.returncode == 0, report or done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    # The driver ran on the library built above (had the sources changed in
    # between, the loader would have built an uninstrumented one).
    assert result["library"] == str(target)
    # Every function of the table ran, but those behind a gate that says
    # this CPU lacks their instructions (the gate itself ran).
    skipped = {name for gate in result["gated_off"] for name in GATED[gate]}
    assert set(abi.FUNCTIONS) - set(result["called"]) == skipped
