"""The load's plan step (sluice/loader/plan_step.py): the execution plan resolved without rebinding.

- resolving reads the plan (here a pinned file) and leaves every layer as it
  was: attention on its default, no fused decode, the W8A8 bands its own;
  only `plan_apply.apply` then gives the layers the plan;
- W8A8 races AMX bfloat16 only from its own threshold, in bfloat16, on a CPU
  with AMX-BF16, and the race's bands go into the plan and the choices, not
  into the layers;
- batch-invariant mode has no kernel plan.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from sluice.config import ModelConfig
from sluice.loader import choices, plan_step
from sluice.models import calibration, int8_threshold
from sluice.models.attention import paged_attention
from sluice.models.kernel_plan import NATIVE, KernelPlan
from sluice.models.llama import LlamaForCausalLM
from sluice.models.plan_apply import apply
from sluice.models.plan_cache import PlanStore

CALIBRATION_IDS = [random.Random(7).randrange(3, 512) for _ in range(300)]
PINNED = KernelPlan(((0, NATIVE),), "pinned")
W8A8 = choices.ModelChoices("bfloat16", None, "bfloat16; int8 activations from 4 rows", "int8")


@pytest.fixture
def model(tiny_loaded, tiny_llama) -> LlamaForCausalLM:
    model = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    calibration.quantize_activations(model, CALIBRATION_IDS)
    return model


@pytest.fixture
def pinned(tmp_path) -> PlanStore:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PINNED.to_fields()))
    return PlanStore.open(str(path), None, "tiny")


def layer_state(model: LlamaForCausalLM) -> list[tuple]:
    return [
        (layer.attend, layer.fused_decode, layer.qkv_proj.int8_row_bands) for layer in model.layers
    ]


def test_resolving_the_plan_reads_it_and_rebinds_nothing(model, pinned, monkeypatch):
    monkeypatch.setattr(choices, "cpu_flags", lambda: frozenset({"avx512_vnni"}))  # no AMX
    before = layer_state(model)
    chosen, plan = plan_step.resolve_plan(ModelConfig(), model, W8A8, pinned, 256, "")
    assert chosen == W8A8 and plan.w8a8_bands is None
    assert plan.kernels is not None and plan.kernels.source == f"from {pinned.pinned}"
    assert layer_state(model) == before
    assert all(layer.attend is paged_attention for layer in model.layers)
    apply(model, plan)
    assert all(layer.attend.keywords["kernels"] == plan.kernels for layer in model.layers)


def test_the_amx_race_goes_into_the_plan_and_the_choices_not_the_layers(model, pinned, monkeypatch):
    monkeypatch.setattr(choices, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(int8_threshold, "race_bands", lambda dense, w8a8, **kw: ())
    before = layer_state(model)
    chosen, plan = plan_step.resolve_plan(ModelConfig(), model, W8A8, pinned, 256, "")
    assert plan.w8a8_bands == () and chosen.activations is None
    assert "lost to AMX bfloat16 in every band" in chosen.reason
    assert layer_state(model) == before and model.layers[0].qkv_proj.int8_activations is not None
    apply(model, plan)
    assert model.layers[0].qkv_proj.int8_activations is None


@pytest.mark.parametrize(
    "chosen",
    [
        choices.ModelChoices("float32", None, "float32", "int8"),
        choices.ModelChoices("bfloat16", None, "row-invariant", "int8", row_invariant=True),
        choices.ModelChoices("bfloat16", None, "no int8 activations"),
    ],
)
def test_only_w8a8_from_its_threshold_in_bfloat16_races(model, pinned, monkeypatch, chosen):
    monkeypatch.setattr(choices, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(int8_threshold, "race_bands", pytest.fail)
    _, plan = plan_step.resolve_plan(ModelConfig(), model, chosen, pinned, 256, "")
    assert plan.w8a8_bands is None


def test_batch_invariant_mode_has_no_kernel_plan(model, pinned):
    config = ModelConfig(batch_invariant=True)
    _, plan = plan_step.resolve_plan(config, model, W8A8, pinned, 256, "gguf")
    assert plan.kernels is None and plan.blocks == "gguf"
