"""Qwen3.5 (sluice/models/qwen3_5.py, gated_deltanet.py): its logits and
greedy tokens are transformers', and every engine path over its Gated
DeltaNet states (chunked prefill, prefix-cache hits through the block
snapshots, preemption, speculation with rolled-back drafts) gives the tokens
of plain whole-prompt runs; under the batch-invariant model, bit for bit."""

from __future__ import annotations

import json
from dataclasses import replace

import msgspec
import pytest
import torch

from sluice.cli import main
from sluice.config import ModelConfig, SpeculativeConfig
from sluice.engine.request import Request
from sluice.engine.speculation import Speculator
from sluice.errors import ModelLoadError
from sluice.loader.choices import cpu_flags
from sluice.loader.loaded_model import LoadedModel, load_model
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.families.registry import build_model, describe_family, parse_hf_config
from sluice.models.gated_deltanet import GatedDeltaNetLayer
from sluice.models.qwen3_5 import GatedAttentionLayer, Qwen3_5ForCausalLM
from tests.model_factory import (
    QWEN3_5_KIND,
    TinyModel,
    build_tiny_model,
    make_core,
    write_tiny_tokenizer,
)
from tests.model_runs import (
    GREEDY,
    PagedRunner,
    assert_close_to_scale,
    hf_logits,
    loaded_float32,
    random_prompts,
    run,
    run_one_by_one,
)
from tests.speculation_runs import ngram
from tests.speculation_runs import run as run_with_logprobs

WITH_LOGPROBS = msgspec.structs.replace(GREEDY, logprobs=2, max_tokens=12)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_model(QWEN3_5_KIND, tmp_path_factory.mktemp(QWEN3_5_KIND))


@pytest.fixture(scope="module")
def loaded(tiny: TinyModel) -> LoadedModel:
    return loaded_float32(tiny)


@pytest.fixture(scope="module")
def invariant(loaded: LoadedModel, tiny: TinyModel) -> LoadedModel:
    """The batch-invariant model (the engine's row-invariant kernels)."""
    model = build_model(loaded.model_config, torch.float32, torch.device("cpu"), True)
    model.load_weights(tiny.weights())
    return replace(loaded, model=model)


def test_linear_layers_get_the_gated_deltanet_class_and_the_others_gated_attention(loaded):
    assert type(loaded.model) is Qwen3_5ForCausalLM
    kinds = [type(layer) for layer in loaded.model.layers]
    assert kinds == [GatedDeltaNetLayer, GatedDeltaNetLayer, GatedAttentionLayer,
                     GatedDeltaNetLayer]  # fmt: skip
    config = loaded.model_config
    assert config.rotary_dim == 4 and config.head_dim == 16  # partial RoPE: a quarter
    note = describe_family(config)
    assert "3 of its 4 layers are Gated DeltaNet linear attention" in note


def test_logits_of_a_prefill_a_chunk_and_a_decode_match_transformers(loaded, tiny):
    prompt = random_prompts(1, seed=5)[0] + [9, 10, 11]
    runner = PagedRunner(loaded.model)
    table: list[int] = []
    first = runner.step([prompt[:-3]], [0], [table])
    chunk = runner.step([prompt[-3:-1]], [len(prompt) - 3], [table])  # both states carried
    decode = runner.step([prompt[-1:]], [len(prompt) - 1], [table])
    reference = hf_logits(tiny, prompt)
    assert_close_to_scale(first, reference[-4:-3], 1e-5)
    assert_close_to_scale(chunk, reference[-2:-1], 1e-5)
    assert_close_to_scale(decode, reference[-1:], 1e-5)


def test_the_output_gate_and_the_gated_norm_matter(loaded, tiny):
    """A loader that dropped the attention gate's rows (every other head of
    q_proj) or the DeltaNet's norm weight would not pass the parity test:
    halving either changes the logits."""
    prompt = random_prompts(1, seed=6)[0]
    reference = hf_logits(tiny, prompt)[-1:]
    for changed in ("layers.2.self_attn.q_proj.weight", "layers.0.linear_attn.norm.weight"):
        model = build_model(loaded.model_config, torch.float32, torch.device("cpu"), False)
        model.load_weights(
            (name, _halved(name, tensor, changed)) for name, tensor in tiny.weights()
        )
        ours = PagedRunner(model).step([prompt], [0], [[]])
        assert (ours - reference).abs().max() > 1e-3


def _halved(name: str, tensor: torch.Tensor, changed: str) -> torch.Tensor:
    """The tensor `changed` halved (q_proj: its gate rows only)."""
    if not name.endswith(changed):
        return tensor
    if "q_proj" not in name:
        return tensor * 0.5
    heads = tensor.clone().view(4, 2, 16, -1)  # [Hq, (q, gate), D, hidden]
    heads[:, 1] *= 0.5
    return heads.view_as(tensor)


def test_greedy_tokens_through_the_engine_match_transformers_generate(loaded, tiny):
    prompts = random_prompts(3, seed=7)
    ours = run(make_core(loaded), prompts)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            generated = tiny.hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24
            )[0]
        assert ours[i] == (generated[len(prompt) :].tolist(), "length")


@pytest.mark.parametrize("budget", [3, 7, 64])
def test_chunked_prefill_gives_whole_prompts_bits(invariant, budget):
    prompts = random_prompts(6, seed=2)
    chunked = run_with_logprobs(make_core(invariant, budget=budget), prompts, WITH_LOGPROBS)
    whole = run_with_logprobs(make_core(invariant, budget=512, chunked=False), prompts,
                              WITH_LOGPROBS)  # fmt: skip
    assert chunked == whole  # tokens and logprobs, bitwise


def test_a_requests_bits_are_the_same_alone_and_in_a_crowd(invariant):
    """A row's state update depends on its own sequence only."""
    prompts = random_prompts(5, seed=13)
    alone = run_with_logprobs(make_core(invariant), prompts[:1], WITH_LOGPROBS)
    crowded = run_with_logprobs(make_core(invariant, budget=32), prompts, WITH_LOGPROBS)
    assert crowded[0][:3] == alone[0][:3]


def test_a_prefix_cache_hit_starts_from_the_snapshot_and_gives_cold_bits(invariant):
    """16-token blocks: a snapshot (9.4 KiB) costs less than the block's K/V
    would if all four layers attended (16 KiB), so prefix caching stays on."""
    base = random_prompts(1, seed=11)[0] * 3
    prompts = [base, base, base[:40] + [7, 8, 9], base + [1]]
    cached_core = make_core(invariant, block_size=16)
    assert cached_core.kv.enable_prefix_caching
    cached = run_one_by_one(cached_core, prompts, WITH_LOGPROBS)
    plain = run_one_by_one(make_core(invariant, prefix_caching=False), prompts, WITH_LOGPROBS)
    assert len(base) >= 40
    assert [c for _, _, c in cached][1:] == [(len(base) - 1) // 16 * 16, 32, len(base) // 16 * 16]
    assert [(t, lp) for t, lp, _ in cached] == [(t, lp) for t, lp, _ in plain]


@pytest.mark.parametrize("prefix_caching", [True, False])  # resumes from snapshots, or from zeros
def test_preempted_requests_resume_with_the_same_greedy_tokens(loaded, prefix_caching):
    prompts = random_prompts(10, seed=3)
    roomy = run(make_core(loaded, num_blocks=512), prompts)
    config = loaded.model_config
    with_snapshots = kv_cache_bytes_per_block(config, 16, torch.float32)
    block_bytes = kv_cache_bytes_per_block(config, 16, torch.float32, prefix_caching)
    budget = -(-10 * block_bytes // with_snapshots)  # make_core's bytes hold 10 blocks here
    core = make_core(replace(loaded, max_model_len=128), num_blocks=budget, block_size=16,
                     prefix_caching=prefix_caching)  # fmt: skip
    assert run(core, prompts) == roomy
    assert core.kv.enable_prefix_caching is prefix_caching
    assert core.scheduler.num_preemptions > 0
    assert core.kv.num_free_blocks == core.kv.num_blocks
    assert core.scheduler.states is not None
    assert core.scheduler.states.num_free_slots == core.scheduler.states.num_slots


class _HalfRightDrafts(Speculator):
    """Drafts the plain run's own next tokens with the third one wrong, so
    every verification accepts some drafts and rejects the rest."""

    def __init__(self, config: SpeculativeConfig, answers: dict[str, list[int]]) -> None:
        super().__init__(config)
        self.answers = answers

    def propose(self, request: Request, max_num_tokens: int, num_running: int = 1) -> list[int]:
        done = len(request.output_token_ids)
        draft = self.answers[request.request_id][done : done + min(4, max_num_tokens)]
        if len(draft) >= 3:
            draft[2] = (draft[2] + 1) % 512
        return draft


def test_speculation_rolls_rejected_drafts_out_of_the_state(invariant):
    """Drafts are accepted and rejected in every verification, so the
    recurrent states and conv tails roll back; tokens and logprobs are
    plain decoding's, bitwise."""
    prompts = random_prompts(3, seed=12)
    plain = run_with_logprobs(make_core(invariant), prompts, WITH_LOGPROBS)
    speculating = make_core(invariant, speculative=ngram(k=4))
    answers = {f"r{i}": result[0] for i, result in plain.items()}
    drafts = _HalfRightDrafts(speculating.speculator.config, answers)
    speculating.speculator = speculating.scheduler.speculator = drafts
    drafted = run_with_logprobs(speculating, prompts, WITH_LOGPROBS)
    assert {i: r[:3] for i, r in drafted.items()} == {i: r[:3] for i, r in plain.items()}
    counters = drafts.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens


def test_prefix_caching_is_off_where_a_snapshot_outweighs_a_dense_blocks_kv(loaded, caplog):
    """4-token blocks: a snapshot (9.4 KiB) would cost more than the block's
    K/V in an all-attention model (4 KiB); the engine says so and keeps none."""
    with caplog.at_level("WARNING", logger="sluice.engine"):
        core = make_core(loaded, block_size=4, max_seqs=5)
    assert "no prefix caching: a state snapshot in every KV block would cost" in caplog.text
    assert "blocks of 10 tokens or more keep it (--block-size)" in caplog.text
    assert not core.kv.enable_prefix_caching and not core.runner.state_snapshots
    assert [c.shape[0] for c in core.runner.kv_caches if c.dim() == 2] == [5, 5, 5]


def test_a_state_row_holds_the_conv_tail_and_the_recurrent_state_in_float32(loaded):
    core = make_core(loaded, prefix_caching=False, max_seqs=5)
    rows = [tuple(c.shape) for c in core.runner.kv_caches if c.dim() == 2]
    # conv tail (4 - 1) x (2 * 2 * 16 + 4 * 8), then 4 value heads of 16 x 8
    assert rows == [(5, 3 * 96 + 4 * 16 * 8)] * 3
    assert {c.dtype for c in core.runner.kv_caches if c.dim() == 2} == {torch.float32}
    config = loaded.model_config
    with_snapshots = kv_cache_bytes_per_block(config, 4, torch.bfloat16)
    without = kv_cache_bytes_per_block(config, 4, torch.bfloat16, with_snapshots=False)
    assert with_snapshots - without == 3 * (3 * 96 + 4 * 16 * 8) * 4


@pytest.mark.slow
def test_the_default_path_gives_the_same_tokens_chunked_and_speculating(tiny, tmp_path):
    """As `sluice serve` loads it (bfloat16, the row-invariant int8 matmuls
    where the CPU has AVX512-VNNI, speculation on): chunking and verified
    drafts change no token."""
    write_tiny_tokenizer(tiny.path, num_tokens=512)
    default = load_model(ModelConfig(model=str(tiny.path), cache_dir=tmp_path))
    if "avx512_vnni" not in cpu_flags():
        pytest.skip("the row-invariant default needs AVX512-VNNI")
    assert default.choices.row_invariant
    prompts = random_prompts(6, seed=2)
    whole = run(make_core(default, budget=512, chunked=False), prompts)
    assert run(make_core(default, budget=7), prompts) == whole
    plain = run_with_logprobs(make_core(default), prompts[:3], WITH_LOGPROBS)
    speculating = make_core(default, speculative=ngram(k=4))
    answers = {f"r{i}": result[0] for i, result in plain.items()}
    drafts = _HalfRightDrafts(speculating.speculator.config, answers)
    speculating.speculator = speculating.scheduler.speculator = drafts
    drafted = run_with_logprobs(speculating, prompts[:3], WITH_LOGPROBS)
    assert {i: r[:3] for i, r in drafted.items()} == {i: r[:3] for i, r in plain.items()}
    assert drafts.counters.num_accepted_tokens > 0


def test_a_multimodal_checkpoint_runs_as_its_text_decoder(tiny, loaded, tmp_path):
    """Qwen3_5ForConditionalGeneration's config nests the text model, its
    weights sit under model.language_model. beside a vision tower."""
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": tiny.config_dict, "tie_word_embeddings": False}  # fmt: skip
    parsed = parse_hf_config(config)
    assert replace(parsed, architecture=loaded.model_config.architecture) == loaded.model_config
    model = build_model(parsed, torch.float32, torch.device("cpu"), False)
    weights = [(name.replace("model.", "model.language_model.", 1), tensor)
               for name, tensor in tiny.weights()]  # fmt: skip
    weights += [("model.visual.blocks.0.attn.qkv.weight", torch.zeros(3, 3)),
                ("mtp.fc.weight", torch.zeros(3, 3))]  # fmt: skip
    model.load_weights(weights)
    prompt = random_prompts(1, seed=8)[0]
    assert torch.equal(PagedRunner(model).step([prompt], [0], [[]]),
                       PagedRunner(loaded.model).step([prompt], [0], [[]]))  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["linear_attention", "mamba", "full_attention", "linear_attention"]},
         "unsupported Qwen3.5 layer type 'mamba'"),
        ({"linear_conv_kernel_dim": 1}, "unsupported linear_conv_kernel_dim 1"),
        ({"linear_num_value_heads": 3}, "unsupported Gated DeltaNet heads"),
        ({"layer_types": ["full_attention"]}, "layer_types names 1 layers, the model has 4"),
    ],
)  # fmt: skip
def test_a_layer_type_or_state_shape_it_cannot_run_is_one_line(tiny, change, message):
    with pytest.raises(ModelLoadError, match=message):
        parse_hf_config(tiny.config_dict | change)


def test_sluice_serve_refuses_a_layer_type_it_cannot_run_with_exit_status_2(tiny, tmp_path, capsys):
    kinds = ["linear_attention", "full_attention", "mamba", "linear_attention"]
    (tmp_path / "config.json").write_text(json.dumps(tiny.config_dict | {"layer_types": kinds}))
    write_tiny_tokenizer(tmp_path, num_tokens=512)
    status = main(["serve", "--model", str(tmp_path), "--port", "0", "--in-process"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert "unsupported Qwen3.5 layer type 'mamba'" in err
