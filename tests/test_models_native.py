"""The C decode-attention kernel against the torch path it replaces.

Same values (float32: to float32 rounding; bfloat16: within one rounding of
the output, or, for heads of 64 and 128, whose rows take prefill's fixed key
blocks, as close as torch's own bfloat16 path), for single and split batches, grouped and plain multi-head
attention, lengths on and off block boundaries, a strided query, and
scattered block tables; bad lengths raise; with the kernels switched off the
caller gets None and keeps the torch path.
"""

from __future__ import annotations

import pytest
import torch

from sluice.models import native
from sluice.models.attention import AttentionMetadata, decode_attention_torch
from sluice.models.native import decode_attention_kernel, find_compiler

BLOCK_SIZE = 16
NUM_BLOCKS = 300

# Skipped only where no compiler exists: where one does, a kernel that did
# not build fails these tests (test_the_library_builds_wherever_a_c_compiler_exists).
requires_kernel = pytest.mark.skipif(find_compiler() is None, reason="no C compiler here")


def cache_and_tables(lengths: list[int], num_kv_heads: int, head_dim: int, generator):
    """A random float32 cache, and a block table of shuffled blocks per length."""
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    order = (torch.randperm(NUM_BLOCKS - 1, generator=generator) + 1).tolist()
    tables = []
    for length in lengths:
        count = -(-length // BLOCK_SIZE)
        tables.append(order[:count])
        order = order[count:]
    return cache, tables


def decode_case(
    lengths: list[int], num_heads: int, num_kv_heads: int, head_dim: int, dtype, seed: int = 0
):
    generator = torch.Generator().manual_seed(seed)
    cache, tables = cache_and_tables(lengths, num_kv_heads, head_dim, generator)
    cache = cache.to(dtype)
    meta = AttentionMetadata.build(
        [1] * len(lengths), [n - 1 for n in lengths], tables, BLOCK_SIZE, "cpu"
    )
    # A query that is a view into a wider qkv tensor, as in the model.
    qkv = torch.randn(len(lengths), num_heads + 2 * num_kv_heads, head_dim, generator=generator)
    q = qkv.to(dtype)[:, :num_heads]
    return q, cache, meta.decode


def run_kernel(q, cache, plan, scale):
    kernel = decode_attention_kernel(q.dtype)
    block_ids = plan.block_ids.view(q.shape[0], plan.num_blocks)
    return kernel(q, cache, block_ids, plan.seq_lens, scale)


@requires_kernel
@pytest.mark.parametrize(
    "lengths",
    [[1], [16], [17], [60], [5, 16, 33, 1], [40 + 7 * i for i in range(9)], [3] * 20],
)
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)])
def test_float32_kernel_equals_the_torch_path(lengths, heads):
    q, cache, plan = decode_case(lengths, *heads, head_dim=64, dtype=torch.float32)
    expected = decode_attention_torch(q, cache, plan, 0.125)
    torch.testing.assert_close(run_kernel(q, cache, plan, 0.125), expected, rtol=1e-5, atol=1e-6)


@requires_kernel
@pytest.mark.parametrize("lengths", [[70], [33, 100, 7, 64, 65, 1, 2, 3, 200]])
@pytest.mark.parametrize(
    ("heads", "head_dim"), [((9, 3), 64), ((8, 1), 128), ((4, 4), 128), ((6, 2), 96)]
)
def test_bfloat16_kernel_within_one_output_rounding_of_exact(lengths, heads, head_dim):
    # One sequence: a task per KV head; nine: a task per sequence (all its
    # heads); head sizes 64 and 128 take the tiled path, 96 the other one.
    q, cache, plan = decode_case(lengths, *heads, head_dim=head_dim, dtype=torch.bfloat16)
    # Exact: the same bfloat16 inputs through the float32 torch path.
    exact = decode_attention_torch(q.float(), cache.float(), plan, 0.125)
    got = run_kernel(q, cache, plan, 0.125).float()
    torch_error = (decode_attention_torch(q, cache, plan, 0.125).float() - exact).abs()
    if head_dim in (64, 128):
        # The fixed key blocks (avx512_attention.h) round the probabilities to
        # bfloat16 as prefill does, so a row's bits match its prefill row's:
        # as close to exact as torch's own bfloat16 path, not one rounding.
        assert (got - exact).abs().max() <= 2 * torch_error.max() + 2**-8
        assert (got - exact).abs().mean() <= 1.5 * torch_error.mean() + 1e-4
        return
    assert ((got - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()
    # And no further from exact than torch's own bfloat16 path.
    assert (got - exact).abs().mean() <= torch_error.mean()


def chunk_rows_case(context: int, num_rows: int, heads, head_dim: int, extra_seqs: int, seed: int):
    """A chunk of `num_rows` tokens after `context` cached ones, run as decode
    rows (row r sees context + r + 1 keys, all on one block table), beside
    `extra_seqs` one-token decodes on tables of their own."""
    generator = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    lengths = [context + num_rows] + [13 * (i + 1) for i in range(extra_seqs)]
    cache, tables = cache_and_tables(lengths, num_kv_heads, head_dim, generator)
    meta = AttentionMetadata.build(
        [num_rows] + [1] * extra_seqs,
        [context] + [n - 1 for n in lengths[1:]],
        tables,
        BLOCK_SIZE,
        "cpu",
    )
    plan = meta.decode
    q = torch.randn(plan.seq_lens.shape[0], num_heads, head_dim, generator=generator)
    return q.to(torch.bfloat16), cache.to(torch.bfloat16), plan


@requires_kernel
@pytest.mark.parametrize("context", [0, 5, 150, 700])
@pytest.mark.parametrize("num_rows", [2, 11, 17, 33])
@pytest.mark.parametrize(("heads", "head_dim"), [((9, 3), 64), ((8, 1), 128), ((4, 4), 64)])
def test_rows_of_one_chunk_give_the_bits_each_row_gives_alone(context, num_rows, heads, head_dim):
    # A speculative step's drafted tokens run as decode rows of one call, beside
    # other sequences' decodes (and the call shares out tasks by how many rows
    # it has): a row's bits must not depend on the rows beside it.
    q, cache, plan = chunk_rows_case(context, num_rows, heads, head_dim, 3, seed=context + num_rows)
    block_ids = plan.block_ids.view(q.shape[0], plan.num_blocks)
    kernel = decode_attention_kernel(torch.bfloat16)
    together = kernel(q, cache, block_ids, plan.seq_lens, 0.125)
    for row in range(q.shape[0]):
        alone = kernel(q[row : row + 1], cache, block_ids[row : row + 1],
                       plan.seq_lens[row : row + 1], 0.125)  # fmt: skip
        assert torch.equal(together[row : row + 1].view(torch.int16), alone.view(torch.int16)), row
    exact = decode_attention_torch(q.float(), cache.float(), plan, 0.125)
    assert ((together.float() - exact).abs() <= exact.abs().max() * 2**-6 + 2**-8).all()


@requires_kernel
def test_other_head_dims_and_scales():
    q, cache, plan = decode_case([20, 50], 6, 2, head_dim=32, dtype=torch.float32)
    expected = decode_attention_torch(q, cache, plan, 0.3)
    torch.testing.assert_close(run_kernel(q, cache, plan, 0.3), expected, rtol=1e-5, atol=1e-6)


@requires_kernel
def test_a_length_beyond_the_block_table_raises():
    q, cache, plan = decode_case([20, 30], 9, 3, head_dim=64, dtype=torch.float32)
    block_ids = plan.block_ids.view(2, plan.num_blocks)
    too_long = torch.tensor([20, plan.num_blocks * BLOCK_SIZE + 1])
    with pytest.raises(ValueError, match="out of range"):
        decode_attention_kernel(torch.float32)(q, cache, block_ids, too_long, 0.125)


@requires_kernel
def test_a_block_id_outside_the_pool_raises():
    q, cache, plan = decode_case([20], 9, 3, head_dim=64, dtype=torch.float32)
    block_ids = torch.tensor([[1, NUM_BLOCKS]])
    with pytest.raises(ValueError, match="out of range"):
        decode_attention_kernel(torch.float32)(q, cache, block_ids, plan.seq_lens, 0.125)


def test_switched_off_the_caller_keeps_the_torch_path(monkeypatch):
    monkeypatch.setenv("SLUICE_NATIVE_KERNELS", "0")
    native._loaded.cache_clear()
    decode_attention_kernel.cache_clear()
    try:
        assert decode_attention_kernel(torch.float32) is None
    finally:
        monkeypatch.delenv("SLUICE_NATIVE_KERNELS")
        native._loaded.cache_clear()
        decode_attention_kernel.cache_clear()


def test_unsupported_dtypes_get_no_kernel():
    assert decode_attention_kernel(torch.float16) is None


@requires_kernel
def test_loading_the_kernels_keeps_subnormal_floats():
    # A library linked with -ffast-math would switch on flush-to-zero for the
    # whole process as it loads.
    decode_attention_kernel(torch.bfloat16)
    tiny = torch.tensor([1e-30], dtype=torch.float32) * 1e-10
    assert tiny.item() != 0.0
    import numpy as np

    assert np.float32(1e-30) * np.float32(1e-10) != 0.0


@requires_kernel
def test_the_library_builds_wherever_a_c_compiler_exists(monkeypatch):
    # Every kernel test above skips only where no compiler exists; this one
    # fails where one does and the build did not work.
    monkeypatch.delenv("SLUICE_NATIVE_KERNELS", raising=False)
    native._loaded.cache_clear()
    try:
        status = native.native_status()
        assert status == native.NativeStatus(True), status.describe()
        assert status.describe() == "native kernels: on"
        assert decode_attention_kernel(torch.float32) is not None
    finally:
        native._loaded.cache_clear()


def fake_compiler(folder, version: str, stderr: str = "") -> str:
    """A `cc` that reports `version` and fails every build with `stderr`."""
    script = folder / f"cc-{len(version)}"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then echo "{version}"; exit 0; fi\n'
        f"printf '%s\\n' '{stderr}' >&2\nexit 1\n"
    )
    script.chmod(0o755)
    return str(script)


def test_a_failed_build_says_why_in_the_log_and_the_status(tmp_path, monkeypatch, caplog):
    error = 'rows.c:12:3: error: unknown type name "v16sf"'
    monkeypatch.setenv("CC", fake_compiler(tmp_path, "fakecc 1.0", error))
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SLUICE_NATIVE_KERNELS", raising=False)
    native._loaded.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="sluice.models.native"):
            status = native.native_status()
    finally:
        native._loaded.cache_clear()
    assert not status.is_on
    assert status.describe() == f"native kernels: off (build failed: {error})"
    # One warning, carrying the compiler's stderr.
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and error in warnings[0].getMessage()


def test_switched_off_or_without_a_compiler_the_status_says_so(monkeypatch):
    monkeypatch.setenv("SLUICE_NATIVE_KERNELS", "0")
    native._loaded.cache_clear()
    try:
        assert native.native_status().describe() == "native kernels: off (SLUICE_NATIVE_KERNELS=0)"
        monkeypatch.delenv("SLUICE_NATIVE_KERNELS")
        monkeypatch.setenv("CC", "no-such-compiler-here")
        native._loaded.cache_clear()
        assert native.native_status().describe() == (
            "native kernels: off (no C compiler (no-such-compiler-here))"
        )
    finally:
        native._loaded.cache_clear()


CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon 8480\nflags\t\t: {}\n"


def test_the_library_is_keyed_by_the_cpu_flags_and_the_compiler(tmp_path):
    from sluice.models.native.build import library_path

    old, new = fake_compiler(tmp_path, "gcc 12"), fake_compiler(tmp_path, "gcc 13.2")
    with_amx = CPUINFO.format("avx512f avx512_bf16 amx_bf16 amx_tile")
    hiding_amx = CPUINFO.format("avx512f avx512_bf16")
    # Same model name, different exposed instructions: different libraries
    # (a VM that hides AMX must not load a library built for AMX).
    assert library_path(old, with_amx) != library_path(old, hiding_amx)
    assert library_path(old, with_amx) != library_path(new, with_amx)
    assert library_path(old, with_amx) == library_path(old, with_amx + CPUINFO.format("other"))


# Loads a tiny model in a fresh process (the kernels are chosen once per
# process) and prints its native status and teacher-forced logprobs, token
# by token (decode steps) and in 16-token chunks (prefill behind context).
_SCORE = """
import json, sys
from sluice.config import ModelConfig
from sluice.loader import load_model
from sluice.models.native import native_status
from sluice.models.scoring import token_logprobs
config = ModelConfig(model=sys.argv[1], cache_dir=sys.argv[2], dtype="bfloat16", quantization=None)
model = load_model(config).model
ids = [(7 * i + 3) % 500 + 3 for i in range(80)]
print(json.dumps({"status": native_status().describe(), "reason": load_model(config).choices.reason,
                  "decode": token_logprobs(model, ids, 1), "prefill": token_logprobs(model, ids, 16)}))
"""


@requires_kernel
def test_a_whole_model_gives_the_same_logprobs_with_native_kernels_off(tiny_folder, tmp_path):
    import json
    import os
    import subprocess
    import sys

    def score(switch: str) -> dict:
        env = {**os.environ, "SLUICE_NATIVE_KERNELS": switch}
        command = [sys.executable, "-c", _SCORE, str(tiny_folder), str(tmp_path)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])

    on, off = score("1"), score("0")
    assert on["status"] == "native kernels: on" and on["status"] in on["reason"]
    assert off["status"] == "native kernels: off (SLUICE_NATIVE_KERNELS=0)"
    assert off["status"] in off["reason"]
    for path in ("decode", "prefill"):
        # bfloat16 roundings in another order: logprobs agree to a few hundredths.
        gaps = [abs(a - b) for a, b in zip(on[path], off[path], strict=True)]
        assert max(gaps) < 0.05, (path, max(gaps))
