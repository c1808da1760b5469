"""The kernel plan (sluice/models/kernel_plan.py): chosen from times on an
injected clock, so no test here depends on this machine's speed.

- attention: one chunk-blind family for every row, prefill and decode, from
  each CPU's shape of results: Zen 4 (no AMX: the AVX512 pair), an AMX CPU
  (the AMX pair wins overall), AMX winning prefill but losing decode by
  more (AVX512), a tie (AVX512); medians decide; torch is never measured;
- a plan sends each chunk length to its band's kernel, says so in one line,
  and says where a pinned plan is not chunk-blind;
- the plan's fields round-trip through the plan cache (plan_cache.py),
  damaged ones are none;
- every measurement reports its repeats' spreads (a busy machine's plan is
  not kept: test_models_plan_cache.py).
"""

from __future__ import annotations

import pytest

from sluice.models import kernel_plan, plan_cache
from sluice.models.kernel_plan import NATIVE, ROWS, TORCH, KernelPlan, parse_bands

AMX_KERNEL = kernel_plan.AMX


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def measure(prefill_ratios, decode_ratios, amx=True, clock=None):
    """measure_attention over candidates whose AMX / AVX512 time is
    prefill_ratios[n] for an n-token prompt and decode_ratios[n] for n rows."""
    clock = clock or FakeClock()

    def takes(seconds):
        def run(n):
            clock.now += seconds(n)

        return run

    native = (takes(lambda n: 1e-6 * n * n), takes(lambda n: 1e-5 * n))
    fast = (
        takes(lambda n: 1e-6 * n * n * prefill_ratios[n]),
        takes(lambda n: 1e-5 * n * decode_ratios[n]),
    )  # fmt: skip
    return kernel_plan.measure_attention(
        native, fast if amx else None, sorted(prefill_ratios), sorted(decode_ratios), clock=clock
    )


def test_without_amx_the_avx512_pair_serves_every_row_and_torch_is_never_timed():
    assert measure({256: 0.5}, {1: 0.5}, amx=False) == NATIVE
    plan = KernelPlan(((0, NATIVE),), "cached")
    assert plan.is_chunk_blind
    assert plan.describe() == "kernel plan (cached): prefill attention native at every length"


def test_where_the_amx_pair_wins_overall_it_serves_every_length_and_every_decode():
    # The Sapphire Rapids shape: AMX prefill slower on short prompts, much
    # faster on long ones; AMX decode 31 against 49 us a row, 113 against 529 at 17.
    assert measure({256: 1.1, 1024: 0.7, 4096: 0.6}, {1: 0.63, 9: 0.21}) == AMX_KERNEL
    plan = KernelPlan(((0, AMX_KERNEL),), "measured at load", decode_attention=AMX_KERNEL)
    assert plan.is_chunk_blind
    assert [plan.prefill_kernel(n) for n in (1, 255, 1024, 7800)] == [AMX_KERNEL] * 4
    assert plan.describe() == (
        "kernel plan (measured at load): prefill attention amx at every length; "
        "decode attention on AMX tiles"
    )


def test_amx_must_win_overall_not_somewhere():
    # Faster on long prompts, slower by more on decodes: the AVX512 pair.
    assert measure({256: 1.5, 1024: 0.9, 4096: 0.9}, {1: 1.6, 9: 1.4}) == NATIVE
    # A tie goes to AVX512.
    assert measure({256: 1.0}, {1: 1.0}) == NATIVE
    assert measure({256: 2.0, 4096: 0.6}, {1: 1.0}) == NATIVE  # 2x slower short, 1.7x faster long


def test_medians_decide_so_one_slow_run_does_not():
    clock = FakeClock()
    runs = iter([1.0, 1.0, 100.0, 1.0])  # warm-up, then one slow timed run of 3

    def native(n):
        clock.now += 2.0

    def amx(n):
        clock.now += next(runs, 1.0)

    assert kernel_plan.measure_attention((native, native), (amx, amx), (256,), (1,),
                                         clock=clock) == AMX_KERNEL  # fmt: skip


def test_a_pinned_plan_that_mixes_kernels_says_it_is_not_chunk_blind():
    apart = KernelPlan(((0, NATIVE), (1024, TORCH), (4096, NATIVE)), "from plan.json")
    assert not apart.is_chunk_blind
    assert [apart.prefill_kernel(n) for n in (5, 2000, 5000)] == [NATIVE, TORCH, NATIVE]
    assert apart.describe() == (
        "kernel plan (from plan.json): prefill attention native below 1024 tokens, torch "
        "from 1024, native from 4096; attention not chunk-blind (a row's bits follow its chunk)"
    )
    mixed_decode = KernelPlan(((0, NATIVE),), "x", decode_attention=AMX_KERNEL)
    assert not mixed_decode.is_chunk_blind
    assert not KernelPlan(((0, TORCH),), "x").is_chunk_blind
    rows = KernelPlan(((0, ROWS),), "no native prefill kernel for torch.float32 heads of 16")
    assert rows.is_chunk_blind
    assert rows.describe().endswith("prefill attention rows at every length")


def write_plan(path, plan):
    assert plan_cache.write_json(path, plan.to_fields())


def read_plan(path, source):
    value = plan_cache.read_json(path)
    return None if value is None else kernel_plan.plan_from_fields(value, source)


def test_the_kept_file_round_trips_and_a_damaged_one_is_none(tmp_path):
    path = tmp_path / "plan.json"
    bands = ((0, NATIVE), (1024, TORCH), (2048, AMX_KERNEL))
    write_plan(path, KernelPlan(bands, "measured at load"))
    assert read_plan(path, "cached") == KernelPlan(bands, "cached")
    for text in (
        "{",
        "[]",
        "{}",
        '{"prefill_attention": []}',
        '{"prefill_attention": [[1, "native"]]}',
        '{"prefill_attention": [[0, "native"], [0, "torch"]]}',
        '{"prefill_attention": [[0, "vnni"]]}',
        '{"prefill_attention": [[0.5, "native"]]}',
    ):
        path.write_text(text)
        assert read_plan(path, "cached") is None, text
    assert parse_bands({"prefill_attention": [[0, "torch"], [4096, "amx"]]}) == (
        (0, TORCH), (4096, AMX_KERNEL),
    )  # fmt: skip
    assert parse_bands({"prefill_attention": [[0, "rows"]]}) == ((0, ROWS),)


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
    assert KernelPlan(((0, NATIVE),), "measured at load", bands).describe() == (
        "kernel plan (measured at load): prefill attention native at every length; "
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
    write_plan(path, KernelPlan(((0, TORCH),), "measured at load", bands))
    assert read_plan(path, "cached").int8_matmul == bands
    path.write_text('{"prefill_attention": [[0, "torch"]]}')
    assert read_plan(path, "cached") == KernelPlan(((0, TORCH),), "cached")
    for text in ('"int8_matmul": [[1, "amx"]]', '"int8_matmul": [[0, "torch"]]'):
        path.write_text('{"prefill_attention": [[0, "torch"]], ' + text + "}")
        assert read_plan(path, "cached") is None, text


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
    write_plan(path, KernelPlan(((0, TORCH),), "x", (), seconds))
    assert read_plan(path, "cached").step_seconds == seconds
    for bad in ("[[1, 0.0]]", "[[8, 1e-5], [1, 1e-5]]", '[[1, "fast"]]', "[[0, 1e-5]]"):
        path.write_text('{"prefill_attention": [[0, "torch"]], "step_seconds": ' + bad + "}")
        assert read_plan(path, "cached") is None, bad


def test_the_decode_kernel_round_trips_and_shows_on_the_startup_line(tmp_path):
    path = tmp_path / "plan.json"
    plan = KernelPlan(((0, AMX_KERNEL),), "measured at load", decode_attention=AMX_KERNEL)
    write_plan(path, plan)
    assert read_plan(path, "measured at load") == plan
    assert plan.describe().endswith("; decode attention on AMX tiles")
    path.write_text('{"prefill_attention": [[0, "amx"]], "decode_attention": "torch"}')
    assert read_plan(path, "cached") is None
    path.write_text('{"prefill_attention": [[0, "amx"]]}')  # an older file: native
    assert read_plan(path, "cached").decode_attention == NATIVE


def test_every_repeat_reports_its_spread_so_a_busy_machine_shows():
    clock = FakeClock()
    runs = iter([1e-3] * 2 + [1e-3, 1e-3, 1e-3, 5e-3, 1e-3, 1e-3])  # warm-ups, then alternating

    def run(n):
        clock.now += next(runs)

    spreads: list[float] = []
    kernel_plan.measure_int8(run, run, rows=(1,), repeats=3, clock=clock, spreads=spreads)
    assert spreads == [pytest.approx(1.0), pytest.approx(5.0)]
