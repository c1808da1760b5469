"""gpt-oss's MXFP4 experts kept in 4 bits (models/mxfp4_experts.py): a
checkpoint as OpenAI publishes it loads with each layer's experts as the
kernel's groups, the float stacks gone and the experts at the file's bytes;
every layer's output and the logits are close to transformers' on the same
rounded values, a token's bits are its own beside any crowd, greedy tokens
do not depend on the chunk budget, and a decode step reads only its experts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader.loaded_model import load_model
from sluice.models.families.registry import build_model, parse_hf_config
from sluice.models.mxfp4_experts import Mxfp4Experts
from sluice.models.native.mxfp4 import mxfp4_available
from tests.gpt_oss_files import build_tiny_gpt_oss, write_mxfp4_folder
from tests.invariance_runs import probe_output, random_prompt
from tests.model_factory import TinyModel, write_tiny_tokenizer
from tests.model_runs import hf_logits, prompt_logits
from tests.speculation_runs import GREEDY, make_core, run

pytestmark = pytest.mark.skipif(not mxfp4_available(), reason="needs the native library")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[TinyModel, Path, dict]:
    directory = tmp_path_factory.mktemp("gpt_oss")
    tiny = build_tiny_gpt_oss(directory / "float")
    state = write_mxfp4_folder(tiny, directory / "mxfp4")
    write_tiny_tokenizer(directory / "mxfp4", num_tokens=512)
    return tiny, directory / "mxfp4", state


def load(folder: Path, tmp_path: Path, dtype: str = "float32"):
    return load_model(ModelConfig(model=str(folder), cache_dir=tmp_path, dtype=dtype))


def test_the_experts_stay_in_mxfp4_at_the_files_bytes(checkpoint, tmp_path):
    _, folder, state = checkpoint
    loaded = load(folder, tmp_path)
    model = loaded.model
    for layer in model.layers:
        assert isinstance(layer.moe.kept, Mxfp4Experts)
        assert layer.moe.gate_up.numel() == 0 and layer.moe.down.numel() == 0
    stored = sum(t.nbytes for name, t in state.items() if "experts." in name)  # with biases
    assert model.expert_bytes() == stored
    assert model.weight_bytes() < stored + 600_000  # attention, embeddings: no float experts
    assert f"expert weights {stored / 2**20:.1f} MiB in MXFP4;" in loaded.choices.reason
    assert "no quantization" not in loaded.choices.reason  # float32: the fallthrough's line
    assert "experts in MXFP4 as the checkpoint has them" in loaded.choices.reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_layers_experts_give_transformers_output_on_the_same_values(checkpoint, dtype):
    tiny, folder, state = checkpoint
    ours = build_model(parse_hf_config(tiny.config_dict | _mxfp4), dtype, "cpu", False)
    ours.load_weights(state.items())
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(1))
    for mine, theirs in zip(ours.layers, tiny.hf_model.model.layers, strict=True):
        got = mine.moe(x.to(dtype), mine.clamped_swiglu).float()
        with torch.no_grad():
            want = theirs.mlp(x[None])[0][0]
        # Only the activations' int8 rounding (and bfloat16) differs: about 1%.
        # A wrong nibble order, scale or gate/up split gives ~100%.
        assert (got - want).norm() < 0.04 * want.norm()


def test_logits_are_close_to_transformers_on_the_same_values(checkpoint, tmp_path):
    tiny, folder, _ = checkpoint
    prompt = random_prompt(random.Random(0), 40)
    ours = prompt_logits(load(folder, tmp_path).model, prompt)
    reference = hf_logits(tiny, prompt)
    # Most positions within 5% of the logits' scale; where two experts nearly
    # tie a position may take the other one and move further.
    close = (ours - reference).abs().amax(dim=-1) < 0.05 * reference.abs().max()
    assert close.float().mean() > 0.9, close


def test_a_tokens_bits_are_its_own_beside_crowds_routed_elsewhere(checkpoint, tmp_path):
    loaded = load(checkpoint[1], tmp_path, dtype="bfloat16")
    rng = random.Random(3)
    probe = random_prompt(rng, 23)
    alone = probe_output(make_core(loaded, None), probe, [], rng)
    for trial in range(3):
        crowd = [random_prompt(rng, rng.randrange(5, 60)) for _ in range(rng.randrange(1, 5))]
        beside = probe_output(make_core(loaded, None), probe, crowd, rng)
        assert beside == alone, trial


def test_greedy_tokens_are_the_same_at_every_chunk_budget(checkpoint, tmp_path):
    loaded = load(checkpoint[1], tmp_path, dtype="bfloat16")
    rng = random.Random(5)
    prompts = [random_prompt(rng, rng.randrange(20, 70)) for _ in range(3)]
    outputs = [run(make_core(loaded, None, budget=budget), prompts, GREEDY)
               for budget in (7, 16, 256)]  # fmt: skip
    for index in range(len(prompts)):
        assert outputs[0][index][0] == outputs[1][index][0] == outputs[2][index][0]
        assert outputs[0][index][2] == outputs[1][index][2] == outputs[2][index][2]


def test_a_decode_step_of_one_token_runs_only_its_k_experts_in_one_call(checkpoint, tmp_path):
    layer = load(checkpoint[1], tmp_path).model.layers[0]
    kept = layer.moe.kept
    kept.forward = lambda expert, swiglu, x: pytest.fail("ran per expert, not in one call")
    x = torch.randn(1, 64)
    before = layer.moe(x, layer.clamped_swiglu)
    chosen, _ = layer.moe.route(x)
    for expert in set(range(8)) - set(chosen[0].tolist()):  # never read: 2^127 exponents
        kept.gate_up[expert].fill_(0xFF)
        kept.down[expert].fill_(0xFF)
    assert torch.equal(layer.moe(x, layer.clamped_swiglu), before) and before.isfinite().all()


def test_a_layer_with_one_stack_in_floats_runs_both_as_floats(checkpoint):
    tiny, _, state = checkpoint
    stem = "model.layers.1.mlp.experts.down_proj"
    mixed = {k: v for k, v in state.items() if k not in (stem + "_blocks", stem + "_scales")}
    mixed[stem] = tiny.hf_model.model.layers[1].mlp.experts.down_proj.detach().clone()
    model = build_model(parse_hf_config(tiny.config_dict | _mxfp4), torch.float32, "cpu", False)
    model.load_weights(mixed.items())
    assert model.layers[1].moe.kept is None and isinstance(model.layers[0].moe.kept, Mxfp4Experts)
    want = tiny.hf_model.model.layers[1].mlp.experts.gate_up_proj.detach()  # [E, H, 2 I]
    assert torch.equal(model.layers[1].moe.gate_up[:, :32], want[:, :, 0::2].transpose(1, 2))


def test_groups_not_of_the_configs_shape_are_one_line(checkpoint):
    tiny, _, state = checkpoint
    stem = "model.layers.2.mlp.experts.gate_up_proj"
    short = dict(state) | {stem + "_blocks": state[stem + "_blocks"][:, :, :1],
                           stem + "_scales": state[stem + "_scales"][:, :, :1]}  # fmt: skip
    model = build_model(parse_hf_config(tiny.config_dict | _mxfp4), torch.float32, "cpu", False)
    with pytest.raises(ModelLoadError, match=rf"MXFP4 tensor {stem} has \(8, 64, 1\) groups, "
                       r"expected \(8, 64, 2\)") as error:  # fmt: skip
        model.load_weights(short.items())
    assert "\n" not in str(error.value)


_mxfp4 = {"quantization_config": {"quant_method": "mxfp4"}}
