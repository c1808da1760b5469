"""The kernel plan a load runs with (sluice/models/kernel_race.py), through
`load_model` and `--kernel-plan auto|measure|FILE`.

- auto measures once on the model's real head shapes (64-wide heads, where
  the native kernel runs), keeps the plan, and the next load reads it back;
  measure measures again; a FILE pins its plan, a bad one is a one-line
  load error naming the flag; the startup reason says the plan and the
  model's layers run on it;
- measured plans are chunk-blind: one family (AVX512 or AMX) for prefill
  and decode, torch's SDPA never a candidate;
- without a native prefill candidate (heads of 16, float32) there is
  nothing to measure: every prefill token a decode-kernel row (ROWS), and
  the reason says why;
- the flag is derived from the config field (`sluice serve --kernel-plan`).
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader import load_model
from sluice.models import kernel_race
from sluice.models.kernel_plan import AMX, NATIVE, ROWS, TORCH, KernelPlan
from sluice.models.native import find_compiler
from sluice.models.native.prefill import prefill_attention_amx_kernel, prefill_attention_kernel
from sluice.models.plan_cache import MEASURE, PlanStore
from tests.model_factory import write_tiny_tokenizer

# The family an AMX CPU's measurement gives (test_models_kernel_plan.py).
AMX_BANDS = ((0, AMX),)


@pytest.fixture(scope="module")
def wide_heads_folder(tmp_path_factory):
    """A tiny random Llama with heads of 64 (the native prefill kernel's size)."""
    folder = tmp_path_factory.mktemp("wide-heads") / "tiny-64"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, vocab_size=512, max_position_embeddings=300,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    write_tiny_tokenizer(folder, num_tokens=512)
    return folder


@pytest.fixture
def measurements(monkeypatch):
    """Each measurement the loads make (of real candidates), answering AMX's bands."""
    calls = []

    def fake_measure(native, amx, lengths, **timing):
        calls.append(list(lengths))
        native[0](lengths[0]), native[1](1)  # prefill and decode run on the model's shapes
        # The AMX pair is a candidate exactly where it runs.
        assert (amx is None) == (prefill_attention_amx_kernel(torch.bfloat16) is None)
        if amx is not None:
            amx[0](lengths[0]), amx[1](1)
        return AMX

    monkeypatch.setattr(kernel_race, "measure_attention", fake_measure)
    return calls


def load(folder, tmp_path, kernel_plan="auto", dtype="bfloat16"):
    return load_model(ModelConfig(model=str(folder), cache_dir=tmp_path, dtype=dtype,
                                  quantization=None, kernel_plan=kernel_plan))  # fmt: skip


native_prefill_here = pytest.mark.skipif(
    find_compiler() is None or prefill_attention_kernel(torch.bfloat16) is None,
    reason="no native prefill kernel here (no compiler or no AVX512-BF16)",
)


@native_prefill_here
def test_auto_measures_once_keeps_the_plan_and_the_next_load_reads_it(
    wide_heads_folder, tmp_path, measurements
):
    first = load(wide_heads_folder, tmp_path)
    # Only the lengths the model can hold are measured (max_position_embeddings 300).
    assert measurements == [[256]]
    assert "kernel plan (measured at load): prefill attention amx at every length; " \
        "decode attention on AMX tiles" in first.choices.reason  # fmt: skip
    kernels = first.model.layers[0].attend.keywords["kernels"]
    assert kernels.prefill_attention == AMX_BANDS and kernels.decode_attention == AMX
    assert kernels.is_chunk_blind
    again = load(wide_heads_folder, tmp_path)
    assert measurements == [[256]]  # read back, not measured
    assert "kernel plan (cached): prefill attention amx at every length" in again.choices.reason
    load(wide_heads_folder, tmp_path, kernel_plan="measure")
    assert measurements == [[256], [256]]


def test_a_file_pins_its_plan_and_a_bad_file_is_a_load_error(
    wide_heads_folder, tmp_path, measurements
):
    pinned = tmp_path / "plan.json"
    pinned.write_text(json.dumps({"prefill_attention": [[0, "torch"], [4096, "native"]]}))
    loaded = load(wide_heads_folder, tmp_path, kernel_plan=str(pinned))
    assert not measurements
    assert f"kernel plan (from {pinned}): prefill attention torch below 4096 tokens, " \
        "native from 4096; attention not chunk-blind" in loaded.choices.reason  # fmt: skip
    plan = loaded.model.layers[0].attend.keywords["kernels"]
    assert plan == KernelPlan(((0, TORCH), (4096, NATIVE)), f"from {pinned}")
    pinned.write_text("{not json")
    with pytest.raises(ModelLoadError, match="--kernel-plan .*plan.json: not a kernel plan file"):
        load(wide_heads_folder, tmp_path, kernel_plan=str(pinned))
    with pytest.raises(ModelLoadError, match="--kernel-plan"):
        load(wide_heads_folder, tmp_path, kernel_plan=str(tmp_path / "missing.json"))


@native_prefill_here
def test_without_a_native_prefill_candidate_decode_kernel_rows_serve_every_length(
    tiny_folder, wide_heads_folder, tmp_path, measurements
):
    narrow = load(tiny_folder, tmp_path)  # heads of 16
    assert "kernel plan (no native prefill kernel for torch.bfloat16 heads of 16): " \
        "prefill attention rows at every length" in narrow.choices.reason  # fmt: skip
    assert narrow.model.layers[0].attend.keywords["kernels"].prefill_attention == ((0, ROWS),)
    in_float32 = load(wide_heads_folder, tmp_path, dtype="float32")
    assert "no native prefill kernel for torch.float32 heads of 64" in in_float32.choices.reason
    assert not measurements


def test_the_flag_is_derived_from_the_config_field():
    from sluice.cli import build_parser

    assert build_parser().parse_args(["serve"]).kernel_plan == "auto"
    args = build_parser().parse_args(["serve", "--kernel-plan", "measure"])
    assert args.kernel_plan == "measure"


@native_prefill_here
def test_the_real_measurement_runs_and_keeps_a_plan(wide_heads_folder, tmp_path):
    from sluice.models.families.registry import parse_hf_config
    from sluice.models.kernel_plan import parse_bands

    config = parse_hf_config(json.loads((wide_heads_folder / "config.json").read_text()))
    store = PlanStore.open(MEASURE, tmp_path, "tiny-64")
    plan = kernel_race.plan_kernels(store, config, torch.bfloat16, 300)
    # Which kernel wins depends on this CPU; that the plan is measured does not.
    assert plan.source == "measured at load" and plan.prefill_attention in (
        ((0, NATIVE),), ((0, AMX),),
    )  # fmt: skip
    assert plan.is_chunk_blind
    # Kept unless this (shared) machine was busy while measuring: then it says so.
    note = store.save()
    kept = list((tmp_path / "calibration").glob("execution-plan-*.json"))
    if note:
        assert not kept and note == "plan not kept: the kernel plan timed on a busy machine"
    else:
        assert parse_bands(json.loads(kept[0].read_text())) == plan.prefill_attention


def test_the_engine_reports_the_plan_for_the_startup_line_and_metrics(tiny_folder, tmp_path):
    from sluice.config import CacheConfig, EngineConfig
    from sluice.engine.core import EngineCore

    model = ModelConfig(model=str(tiny_folder), dtype="bfloat16", quantization=None,
                        cache_dir=tmp_path)  # fmt: skip
    core = EngineCore(EngineConfig(model=model, cache=CacheConfig(kv_cache_memory_bytes=8 << 20)))
    assert core.info.kernel_plan == core.loaded.kernel_plan
    assert core.info.kernel_plan.startswith("kernel plan (no native prefill kernel")
    assert core.info.kernel_plan in core.loaded.choices.reason  # the startup line's reason
    invariant = ModelConfig(model=str(tiny_folder), dtype="bfloat16", quantization=None,
                            cache_dir=tmp_path, batch_invariant=True)  # fmt: skip
    assert load_model(invariant).kernel_plan == ""  # that mode has its own attention path
