"""The prefill attention plan (sluice/models/kernel_plan.py): chosen per band
of prompt lengths from times on an injected clock, so no test here depends
on this machine's speed.

- each CPU's shape of results: AMX (torch's SDPA on AMX tiles wins long
  prompts, the native kernel short ones; with the AMX kernel as a third
  candidate, it takes the long ones), Zen 4 (native wins every length),
  torch everywhere, bands apart (no monotonicity assumed); a tie goes to
  torch, then to AMX; medians decide;
- a plan sends each chunk length to its band's kernel, and says so in one line;
- the kept file round-trips, a damaged one is none, and its name changes
  with the CPU's flags line, the thread count and the head shapes.
"""

from __future__ import annotations

import pytest
import torch

from sluice.models import kernel_plan
from sluice.models.decoder_config import DecoderConfig
from sluice.models.families.registry import parse_hf_config
from sluice.models.kernel_plan import NATIVE, TORCH, KernelPlan, measure_prefill, parse_bands

AMX_KERNEL = kernel_plan.AMX

# Native / torch time per prompt length, as each CPU's kind gave them (issue 27).
AMX = {256: 0.8, 1024: 2.4, 4096: 3.8}
ZEN4 = {256: 0.5, 1024: 0.6, 4096: 0.7}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def measure(ratios, amx_ratios=None, **kwargs):
    """measure_prefill over candidates whose native / torch time at n is
    ratios[n] (and the AMX kernel's, amx_ratios[n], where given)."""
    clock = FakeClock()

    def native(n):
        clock.now += 1e-6 * n * n * ratios[n]

    def amx(n):
        clock.now += 1e-6 * n * n * amx_ratios[n]

    def sdpa(n):
        clock.now += 1e-6 * n * n

    amx_candidate = None if amx_ratios is None else amx
    lengths = sorted(ratios)
    return measure_prefill(native, sdpa, lengths, clock=clock, amx=amx_candidate, **kwargs)


def test_on_amx_torch_serves_long_prompts_and_native_short_ones():
    bands = measure(AMX)
    assert bands == ((0, NATIVE), (1024, TORCH))
    plan = KernelPlan(bands, "measured at load")
    assert [plan.prefill_kernel(n) for n in (1, 255, 1023, 1024, 6300)] == [
        NATIVE, NATIVE, NATIVE, TORCH, TORCH,
    ]  # fmt: skip
    assert plan.describe() == (
        "kernel plan (measured at load): prefill attention native below 1024 tokens, "
        "torch from 1024"
    )


def test_on_zen4_native_serves_every_length():
    assert measure(ZEN4) == ((0, NATIVE),)
    assert KernelPlan(measure(ZEN4), "cached").describe() == (
        "kernel plan (cached): prefill attention native at every length"
    )


def test_torch_everywhere_ties_to_torch_and_bands_apart():
    assert measure({256: 1.5, 1024: 2.0, 4096: 3.0}) == ((0, TORCH),)
    assert measure({256: 1.0, 1024: 1.0}) == ((0, TORCH),)  # native must win to serve
    apart = measure({256: 0.9, 1024: 1.2, 4096: 0.9})
    assert apart == ((0, NATIVE), (1024, TORCH), (4096, NATIVE))
    assert KernelPlan(apart).prefill_kernel(2000) == TORCH
    assert KernelPlan(apart).prefill_kernel(5000) == NATIVE


def test_where_the_amx_kernel_wins_long_prompts_it_serves_them():
    # AMX kernel / torch time per length: slower than native when short, the
    # fastest of the three from 1,024 tokens.
    bands = measure(AMX, {256: 1.1, 1024: 0.7, 4096: 0.6})
    assert bands == ((0, NATIVE), (1024, AMX_KERNEL))
    plan = KernelPlan(bands, "measured at load")
    assert [plan.prefill_kernel(n) for n in (255, 1024, 7800)] == [NATIVE, AMX_KERNEL, AMX_KERNEL]
    assert plan.describe() == (
        "kernel plan (measured at load): prefill attention native below 1024 tokens, amx from 1024"
    )
    # Where it wins nowhere, it serves nowhere; ties go to torch, then to AMX.
    assert measure(AMX, {256: 2.0, 1024: 1.5, 4096: 1.2}) == ((0, NATIVE), (1024, TORCH))
    assert measure(AMX, {256: 1.5, 1024: 1.0, 4096: 1.0}) == ((0, NATIVE), (1024, TORCH))
    clock = FakeClock()

    def seconds(took):
        def run(n):
            clock.now += took

        return run

    tie = measure_prefill(seconds(2.0), seconds(3.0), (256,), clock=clock, amx=seconds(2.0))
    assert tie == ((0, AMX_KERNEL),)


def test_medians_decide_so_one_slow_run_does_not():
    clock = FakeClock()
    runs = iter([1.0, 1.0, 100.0])  # warm-up, then one slow timed run of 3

    def native(n):
        clock.now += next(runs, 1.0)

    def sdpa(n):
        clock.now += 2.0

    assert measure_prefill(native, sdpa, lengths=(256,), clock=clock) == ((0, NATIVE),)


def test_the_kept_file_round_trips_and_a_damaged_one_is_none(tmp_path):
    path = tmp_path / "plan.json"
    bands = ((0, NATIVE), (1024, TORCH), (2048, AMX_KERNEL))
    kernel_plan.write_plan(path, KernelPlan(bands, "measured at load"))
    assert kernel_plan.read_plan(path, "cached") == KernelPlan(bands, "cached")
    for text in (
        "{",
        "[]",
        '{"prefill_attention": []}',
        '{"prefill_attention": [[1, "native"]]}',
        '{"prefill_attention": [[0, "native"], [0, "torch"]]}',
        '{"prefill_attention": [[0, "vnni"]]}',
        '{"prefill_attention": [[0.5, "native"]]}',
    ):
        path.write_text(text)
        assert kernel_plan.read_plan(path, "cached") is None, text
    assert parse_bands({"prefill_attention": [[0, "torch"], [4096, "amx"]]}) == (
        (0, TORCH), (4096, AMX_KERNEL),
    )  # fmt: skip


def config(heads: int = 9, kv_heads: int = 3) -> DecoderConfig:
    return parse_hf_config({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64 * heads,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": 512, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
    })  # fmt: skip


def test_the_kept_plan_is_keyed_by_cpu_flags_threads_and_head_shapes(tmp_path, monkeypatch):
    from sluice.models.native import build

    def key(**kw):
        return kernel_plan.plan_file(tmp_path, kw.get("config", config()), torch.bfloat16, (256,))

    first = key()
    assert key() == first
    assert key(config=config(8, 2)) != first
    monkeypatch.setattr(build, "cpu_identity", lambda: "model name: Xeon\nflags: avx512f amx_bf16")
    with_amx = key()
    monkeypatch.setattr(build, "cpu_identity", lambda: "model name: Xeon\nflags: avx512f")
    assert key() != with_amx != first
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert key() != with_amx
    finally:
        torch.set_num_threads(threads)


# AMX / VNNI time of the int8 matmul per count of code rows, as each CPU gave them.
AMX_INT8 = {1: 1.5, 2: 1.3, 4: 1.1, 8: 0.8, 16: 0.5, 32: 0.4, 64: 0.35, 512: 0.3}
# A shape no CPU showed yet: AMX wins a middle band, loses at 64, wins again.
APART_INT8 = {1: 1.5, 2: 1.3, 4: 1.1, 8: 0.8, 16: 0.5, 32: 1.1, 64: 1.2, 512: 0.3}


def measure_rows(ratios):
    clock = FakeClock()

    def amx(n):
        clock.now += 1e-6 * n * ratios[n]

    def vnni(n):
        clock.now += 1e-6 * n

    return kernel_plan.measure_int8(amx, vnni, rows=sorted(ratios), clock=clock)[0]


def test_the_int8_matmul_bands_follow_each_cpus_times():
    bands = measure_rows(AMX_INT8)
    assert bands == ((0, kernel_plan.VNNI), (8, kernel_plan.AMX))
    assert KernelPlan(((0, TORCH),), "measured at load", bands).describe() == (
        "kernel plan (measured at load): prefill attention torch at every length; "
        "int8 matmul vnni below 8 rows, amx from 8"
    )
    assert measure_rows(APART_INT8) == (
        (0, kernel_plan.VNNI), (8, kernel_plan.AMX), (32, kernel_plan.VNNI), (512, kernel_plan.AMX),
    )  # fmt: skip
    # A tie goes to VNNI: AMX must win to serve.
    assert measure_rows(dict.fromkeys(AMX_INT8, 1.0)) == ((0, kernel_plan.VNNI),)


def test_int8_bands_round_trip_and_an_older_file_has_none(tmp_path):
    path = tmp_path / "plan.json"
    bands = ((0, kernel_plan.VNNI), (8, kernel_plan.AMX))
    kernel_plan.write_plan(path, KernelPlan(((0, TORCH),), "measured at load", bands))
    assert kernel_plan.read_plan(path, "cached").int8_matmul == bands
    path.write_text('{"prefill_attention": [[0, "torch"]]}')
    assert kernel_plan.read_plan(path, "cached") == KernelPlan(((0, TORCH),), "cached")
    for text in ('"int8_matmul": [[1, "amx"]]', '"int8_matmul": [[0, "torch"]]'):
        path.write_text('{"prefill_attention": [[0, "torch"]], ' + text + "}")
        assert kernel_plan.read_plan(path, "cached") is None, text


def test_the_int8_matrix_shape_keys_the_kept_plan(tmp_path):
    def key(shape):
        return kernel_plan.plan_file(tmp_path, config(), torch.bfloat16, (256,), shape)

    assert key("[3072 x 576]") != key("") != key("[1536 x 576]")


def test_the_faster_kernels_times_are_kept_for_speculation():
    clock = FakeClock()

    def amx(n):
        clock.now += 1e-6 * n * AMX_INT8[n]

    def vnni(n):
        clock.now += 1e-6 * n

    bands, seconds = kernel_plan.measure_int8(amx, vnni, rows=sorted(AMX_INT8), clock=clock)
    assert [rows for rows, _ in seconds] == sorted(AMX_INT8)
    for rows, took in seconds:
        assert took == pytest.approx(1e-6 * rows * min(1.0, AMX_INT8[rows]))
    # Without AMX: VNNI's times, and no bands to choose.
    no_bands, vnni_seconds = kernel_plan.measure_int8(None, vnni, rows=(1, 8), clock=clock)
    assert no_bands == () and vnni_seconds == (
        (1, pytest.approx(1e-6)), (8, pytest.approx(8e-6)),
    )  # fmt: skip


def test_step_seconds_round_trip_and_bad_ones_are_refused(tmp_path):
    path = tmp_path / "plan.json"
    seconds = ((1, 2e-5), (8, 3e-5), (64, 2e-4))
    kernel_plan.write_plan(path, KernelPlan(((0, TORCH),), "x", (), seconds))
    assert kernel_plan.read_plan(path, "cached").step_seconds == seconds
    for bad in ("[[1, 0.0]]", "[[8, 1e-5], [1, 1e-5]]", '[[1, "fast"]]', "[[0, 1e-5]]"):
        path.write_text('{"prefill_attention": [[0, "torch"]], "step_seconds": ' + bad + "}")
        assert kernel_plan.read_plan(path, "cached") is None, bad


def measure_decode_rows(native_seconds, amx_seconds):
    """measure_decode over candidates taking native_seconds[n] and
    amx_seconds[n] for n rows of one sequence."""
    clock = FakeClock()

    def native(n):
        clock.now += native_seconds[n]

    def amx(n):
        clock.now += amx_seconds[n]

    return kernel_plan.measure_decode(native, amx, sorted(native_seconds), clock=clock)


def test_decode_attention_goes_to_amx_only_where_it_wins_every_step_shape():
    # The AMX machine: faster alone and much faster verifying (30 against 49
    # us at one row, 113 against 529 at 17).
    assert measure_decode_rows({1: 49, 9: 300}, {1: 30, 9: 70}) == kernel_plan.AMX
    # Faster only at verification: single decodes would pay, so native.
    assert measure_decode_rows({1: 49, 9: 300}, {1: 79, 9: 90}) == NATIVE
    assert measure_decode_rows({1: 49, 9: 300}, {1: 49, 9: 90}) == NATIVE  # a tie: native
    assert kernel_plan.measure_decode(lambda n: None, None) == NATIVE  # no AMX tiles


def test_the_decode_kernel_round_trips_and_shows_on_the_startup_line(tmp_path):
    path = tmp_path / "plan.json"
    plan = KernelPlan(((0, AMX_KERNEL),), "measured at load", decode_attention=AMX_KERNEL)
    kernel_plan.write_plan(path, plan)
    assert kernel_plan.read_plan(path, "measured at load") == plan
    assert plan.describe().endswith("; decode attention on AMX tiles")
    path.write_text('{"prefill_attention": [[0, "amx"]], "decode_attention": "torch"}')
    assert kernel_plan.read_plan(path, "cached") is None
    path.write_text('{"prefill_attention": [[0, "amx"]]}')  # an older file: native
    assert kernel_plan.read_plan(path, "cached").decode_attention == NATIVE
