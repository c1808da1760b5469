"""The execution plan's one cache (sluice/models/plan_cache.py).

- one key: the file's name changes with the CPU's flags line, the thread
  count and the model's part (shapes, dtypes, choices), nothing else;
- one atomic writer (the calibration's maxima use it too): the file
  round-trips, a damaged or non-object file reads as none, a write that
  fails midway keeps the old file, no scratch file is left behind;
- `--kernel-plan auto` reads the kept file, `measure` ignores it, FILE pins
  a file and is never written; what a load measured is written once beside
  what it read;
- a plan measured on a busy machine (repeat timings apart by more than
  BUSY_SPREAD) serves the run but is not kept, for each CPU shape the
  decision knows (AMX, AVX512 without AMX, no AVX512), on an injected clock.
"""

from __future__ import annotations

import json

import pytest
import torch

from sluice.models import kernel_race, plan_cache
from sluice.models.decoder_config import DecoderConfig
from sluice.models.families.registry import parse_hf_config
from sluice.models.kernel_plan import AMX, NATIVE, ROWS, TORCH, VNNI
from sluice.models.kernel_race import Int8Candidates, PrefillCandidates
from sluice.models.plan_cache import AUTO, MEASURE, PlanStore

BUSY = "plan not kept: the kernel plan timed on a busy machine"


def test_the_file_is_keyed_by_cpu_flags_threads_and_the_model(tmp_path, monkeypatch):
    from sluice.models.native import build

    def key(model_part="heads 9/3/64"):
        return plan_cache.plan_path(tmp_path, model_part)

    first = key()
    assert key() == first and first.parent == tmp_path / "calibration"
    assert key("heads 8/2/64") != first
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


def test_the_model_part_follows_shapes_dtypes_and_choices():
    small, wide = torch.nn.Linear(4, 8), torch.nn.Linear(4, 16)
    part = plan_cache.model_key(small, torch.bfloat16, "int4", "int8")
    assert part == plan_cache.model_key(torch.nn.Linear(4, 8), torch.bfloat16, "int4", "int8")
    assert part != plan_cache.model_key(wide, torch.bfloat16, "int4", "int8")
    assert part != plan_cache.model_key(small, torch.float32, "int4", "int8")
    assert part != plan_cache.model_key(small, torch.bfloat16, None, "int8")


def test_the_writer_is_atomic_and_damaged_files_read_as_none(tmp_path):
    path = tmp_path / "deeper" / "plan.json"
    assert plan_cache.write_json(path, {"w8a8_bands": [[4, None]]})
    assert plan_cache.read_json(path) == {"w8a8_bands": [[4, None]]}
    assert [p.name for p in path.parent.iterdir()] == ["plan.json"]  # no scratch left
    for text in ("{", "[]", '"text"'):
        path.write_text(text)
        assert plan_cache.read_json(path) is None, text
    assert plan_cache.read_json(tmp_path / "missing.json") is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert not plan_cache.write_json(blocked / "plan.json", {})  # its folder is a file


def test_a_write_that_fails_midway_keeps_the_old_file_and_no_scratch(tmp_path):
    path = tmp_path / "maxima.pt"
    assert plan_cache.write_atomically(path, lambda scratch: scratch.write(b"old"), "test")

    def fails(scratch):
        scratch.write(b"half")
        raise OSError("disk full")

    assert not plan_cache.write_atomically(path, fails, "test")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["maxima.pt"]


def test_repeats_apart_by_jitter_are_steady_and_by_a_preemption_are_not():
    assert plan_cache.spread([1e-5, 3e-5, 1e-5]) == 1.0  # microseconds apart: jitter
    assert plan_cache.is_steady([plan_cache.spread([1e-3, 1.5e-3, 1e-3])])
    assert plan_cache.spread([1e-3, 1e-3 + PREEMPTED_S]) == pytest.approx(3.0)
    assert not plan_cache.is_steady([1.0, plan_cache.spread([1e-3, 1e-3 + PREEMPTED_S])])


def test_auto_reads_measure_ignores_and_a_pinned_file_is_never_written(tmp_path):
    store = PlanStore.open(AUTO, tmp_path, "model")
    assert store.kept == {} and store.source == "cached"
    store.put({"w8a8_bands": [[4, None]]}, [1.0, 1.5], "the W8A8 race")
    store.put({"decode_attention": "native"}, [], "the kernel plan")
    assert store.save() == ""
    kept = {"w8a8_bands": [[4, None]], "decode_attention": "native"}
    assert PlanStore.open(AUTO, tmp_path, "model").kept == kept
    assert PlanStore.open(MEASURE, tmp_path, "model").kept == {}
    assert PlanStore.open(AUTO, tmp_path, "another model").kept == {}
    pinned = tmp_path / "pinned.json"
    pinned.write_text(json.dumps({"prefill_attention": [[0, "native"]]}))
    store = PlanStore.open(str(pinned), tmp_path, "model")
    assert store.source == f"from {pinned}" and store.path is None
    store.put({"w8a8_bands": []}, [], "the W8A8 race")
    assert store.save() == ""
    assert json.loads(pinned.read_text()) == {"prefill_attention": [[0, "native"]]}


def test_a_cache_dir_given_as_text_keeps_the_plan_in_the_same_file(tmp_path):
    """A ModelConfig built in Python may carry its cache_dir as a str (the
    native-kernels test does); the store failed on `str / str` before."""
    store = PlanStore.open(AUTO, str(tmp_path), "model")
    assert store.path == PlanStore.open(AUTO, tmp_path, "model").path


def test_an_older_separate_cache_file_is_ignored(tmp_path):
    folder = tmp_path / "calibration"
    folder.mkdir()
    (folder / "kernel-plan-0123456789abcdef01234567.json").write_text('{"prefill_attention": []}')
    (folder / "w8a8-bands-0123456789abcdef01234567.json").write_text("{}")
    assert PlanStore.open(AUTO, tmp_path, "model").kept == {}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def config() -> DecoderConfig:
    return parse_hf_config({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    })  # fmt: skip


# What a preempted run loses: a scheduler slice.
PREEMPTED_S = 2e-3


def candidate(clock, seconds, busy_on=None):
    """A kernel that takes `seconds` of the fake clock a call; its call
    number `busy_on` is preempted."""
    calls = []

    def run(n):
        calls.append(n)
        clock.now += seconds + (PREEMPTED_S if len(calls) == busy_on else 0.0)

    return run


def fake_cpu(monkeypatch, clock, shape, busy):
    """The kernels a CPU of `shape` offers: "amx", "avx512" (no AMX), or
    "no avx512" (no native prefill kernel; VNNI int8 only); `busy`: one
    timed run of the native prefill kernel (where timed: AMX against it)
    and of the VNNI matmul is preempted."""
    native = candidate(clock, 2e-3, busy_on=3 if busy else None)  # 1: agreement check, 2: warm-up
    if shape == "no avx512":
        monkeypatch.setattr(kernel_race, "prefill_candidates", lambda *_: "no AVX512-BF16")
    else:
        amx = candidate(clock, 1e-3) if shape == "amx" else None
        prefill = PrefillCandidates(native, candidate(clock, 3e-3), amx)
        monkeypatch.setattr(kernel_race, "prefill_candidates", lambda *_: prefill)
        decode = (candidate(clock, 1e-4), candidate(clock, 5e-5) if shape == "amx" else None)
        monkeypatch.setattr(kernel_race, "decode_candidates", lambda *_: decode)
    vnni = candidate(clock, 1e-4, busy_on=2 if busy else None)  # 1: warm-up
    amx_int8 = candidate(clock, 2e-4) if shape == "amx" else None
    return Int8Candidates(amx_int8, vnni)


@pytest.mark.parametrize(
    ("shape", "family", "int8"),
    [("amx", AMX, ((0, VNNI),)), ("avx512", NATIVE, ()), ("no avx512", ROWS, ())],
)
@pytest.mark.parametrize("busy", [False, True])
def test_a_plan_timed_on_a_busy_machine_serves_the_run_but_is_not_kept(
    tmp_path, monkeypatch, shape, family, int8, busy
):
    clock = FakeClock()
    int8_candidates = fake_cpu(monkeypatch, clock, shape, busy)
    store = PlanStore.open(AUTO, tmp_path, shape)
    plan = kernel_race.plan_kernels(store, config(), torch.bfloat16, 4096, int8_candidates, clock)
    assert plan.source == "measured at load"
    assert plan.prefill_attention[0][1] in (family, TORCH) and plan.int8_matmul == int8
    assert plan.decode_attention == (AMX if family == AMX else NATIVE)
    assert store.save() == (BUSY if busy else "")
    again = PlanStore.open(AUTO, tmp_path, shape)
    if busy:  # the next start measures again
        assert again.kept == {}
    else:  # the next start reads the plan back, timing nothing
        before = clock.now
        kept = kernel_race.plan_kernels(again, config(), torch.bfloat16, 4096, int8_candidates)
        assert kept.source == "cached" and clock.now == before
        assert (kept.prefill_attention, kept.int8_matmul) == (plan.prefill_attention, int8)


def test_with_nothing_to_measure_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_race, "prefill_candidates", lambda *_: "no AVX512-BF16")
    store = PlanStore.open(AUTO, tmp_path, "model")
    plan = kernel_race.plan_kernels(store, config(), torch.bfloat16, 4096)
    assert plan.source == "no AVX512-BF16" and store.save() == ""
    assert not (tmp_path / "calibration").exists()
