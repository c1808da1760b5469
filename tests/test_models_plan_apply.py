"""The execution plan applied (sluice/models/plan_apply.py): the one place layers take their strategies.

- paged-attention layers take the plan's kernels; layers on another path
  (capped scores, batch-invariant mode) keep theirs, and no plan leaves
  paged attention on its default kernels;
- every W8A8 matmul takes the plan's int8 kernel bands;
- W8A8 serves only the plan's raced bands; empty bands drop it and the
  model's activation mode;
- fused decode goes exactly to the layers that declare their decode step is
  the native chain (a float32 model: none; the row-invariant scheme in
  bfloat16: all), and the returned plan counts them.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

from sluice.models import calibration
from sluice.models.attention import batch_invariant_attention, paged_attention
from sluice.models.execution_plan import ExecutionPlan
from sluice.models.int8_activations import Int8ActivationLinear
from sluice.models.kernel_plan import AMX, NATIVE, VNNI, KernelPlan
from sluice.models.linear import Linear
from sluice.models.llama import LlamaForCausalLM
from sluice.models.native.int8 import int8_gemm_kernels
from sluice.models.plan_apply import apply

CALIBRATION_IDS = [random.Random(7).randrange(3, 512) for _ in range(300)]
PLAN = KernelPlan(((0, NATIVE),), "test", ((0, VNNI), (8, AMX)))


def built(tiny_loaded, tiny_llama, dtype=torch.float32, **config_changes) -> LlamaForCausalLM:
    config = dataclasses.replace(tiny_loaded.model_config, **config_changes)
    model = LlamaForCausalLM(config, dtype, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    return model


def test_paged_attention_layers_take_the_plans_kernels(tiny_loaded, tiny_llama):
    model = built(tiny_loaded, tiny_llama)
    assert all(layer.attend is paged_attention for layer in model.layers)
    apply(model, ExecutionPlan(PLAN))
    for layer in model.layers:
        assert isinstance(layer.attend, functools.partial)
        assert layer.attend.func is paged_attention and layer.attend.keywords == {"kernels": PLAN}


def test_without_a_kernel_plan_attention_stays_on_its_default(tiny_loaded, tiny_llama):
    model = built(tiny_loaded, tiny_llama)
    apply(model, ExecutionPlan(None))
    assert all(layer.attend is paged_attention for layer in model.layers)


def test_layers_on_another_attention_path_keep_it(tiny_loaded, tiny_llama):
    capped = built(tiny_loaded, tiny_llama, attn_logit_softcapping=30.0)
    kept = [layer.attend for layer in capped.layers]
    apply(capped, ExecutionPlan(PLAN))
    assert [layer.attend for layer in capped.layers] == kept
    config = tiny_loaded.model_config
    invariant = LlamaForCausalLM(config, torch.float32, torch.device("cpu"), batch_invariant=True)
    invariant.load_weights(tiny_llama.weights())
    apply(invariant, ExecutionPlan(PLAN))
    assert all(layer.attend is batch_invariant_attention for layer in invariant.layers)


def test_every_w8a8_matmul_takes_the_plans_int8_kernel_bands(tiny_loaded, tiny_llama, monkeypatch):
    model = built(tiny_loaded, tiny_llama, torch.bfloat16)
    calibration.quantize_activations(model, CALIBRATION_IDS)
    served = []
    monkeypatch.setattr(
        Int8ActivationLinear, "serve_bands", lambda self, bands: served.append((self, bands))
    )
    apply(model, ExecutionPlan(PLAN))
    w8a8 = [m.int8_activations for m in model.modules() if isinstance(m, Linear)]
    w8a8 = [layer for layer in w8a8 if layer is not None]
    assert w8a8 and served == [(layer, PLAN.int8_matmul) for layer in w8a8]


def test_w8a8_serves_the_plans_bands_only(tiny_loaded, tiny_llama):
    model = built(tiny_loaded, tiny_llama, torch.bfloat16)
    calibration.quantize_activations(model, CALIBRATION_IDS)
    qkv = model.layers[0].qkv_proj
    own = qkv.int8_activations.min_rows
    bands = (range(own, own + 8), range(own + 32, own + 64))
    apply(model, ExecutionPlan(None, bands))
    assert qkv.int8_row_bands == bands and model.activation_quantization == "int8"
    x = torch.randn(own + 8, model.config.hidden_size).bfloat16()
    assert torch.equal(qkv(x), qkv.dense_matmul(x))  # between the bands: dense
    assert torch.equal(qkv(x[:own]), qkv.int8_activations(x[:own]))


def test_bands_that_are_empty_drop_w8a8_and_the_activation_mode(tiny_loaded, tiny_llama):
    model = built(tiny_loaded, tiny_llama, torch.bfloat16)
    calibration.quantize_activations(model, CALIBRATION_IDS)
    apply(model, ExecutionPlan(None, ()))
    assert model.activation_quantization is None
    assert not any(
        isinstance(m, Linear) and m.int8_activations is not None for m in model.modules()
    )


def test_a_float32_model_decodes_no_layer_in_one_native_call(tiny_loaded, tiny_llama):
    model = built(tiny_loaded, tiny_llama)
    plan = apply(model, ExecutionPlan(PLAN))
    assert plan.fused_decode_layers == (0, len(model.layers))
    assert all(layer.fused_decode is None for layer in model.layers)
    assert "decode steps" not in plan.describe()


@pytest.mark.skipif(int8_gemm_kernels() is None, reason="no native int8 matmul (AVX512-VNNI)")
def test_the_row_invariant_scheme_decodes_every_layer_in_one_native_call(tiny_loaded, tiny_llama):
    model = built(tiny_loaded, tiny_llama, torch.bfloat16)
    calibration.quantize_row_invariant(model, CALIBRATION_IDS)
    assert all(layer.decodes_as_native_chain() for layer in model.layers)
    assert all(layer.fused_decode is None for layer in model.layers)  # calibration binds nothing
    plan = apply(model, ExecutionPlan(PLAN))
    layers = len(model.layers)
    assert plan.fused_decode_layers == (layers, layers)
    assert all(layer.fused_decode is not None for layer in model.layers)
    assert f"decode steps: {layers} of {layers} decoder layers" in plan.describe()
