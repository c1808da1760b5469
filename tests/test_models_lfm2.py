"""LFM2, the first hybrid (sluice/models/lfm2.py, short_conv.py): its logits
and greedy tokens are transformers', and every engine path over its
per-sequence conv states (chunked prefill, prefix-cache hits through the
block snapshots, preemption, speculation with rolled-back drafts) gives the
tokens of plain whole-prompt runs."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from sluice.cli import main
from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader.choices import cpu_flags
from sluice.loader.loaded_model import LoadedModel, load_model
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.families.registry import describe_family, parse_hf_config
from sluice.models.lfm2 import Lfm2ForCausalLM
from sluice.models.short_conv import ShortConvLayer
from tests.engine_paths import (
    check_chunked_prefill_equals_whole_prompts,
    check_preemption_resumes_exactly,
    check_prefix_cache_hit_equals_cold,
    check_speculation_keeps_greedy_tokens,
)
from tests.gguf_files import write_tiny_lfm2_gguf
from tests.model_factory import (
    LFM2_KIND,
    TinyModel,
    build_tiny_model,
    make_core,
    write_tiny_tokenizer,
)
from tests.model_runs import (
    PagedRunner,
    assert_close_to_scale,
    hf_logits,
    loaded_float32,
    random_prompts,
    run,
)
from tests.speculation_runs import ngram, repeating_prompt
from tests.speculation_runs import run as run_speculating


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModel:
    return build_tiny_model(LFM2_KIND, tmp_path_factory.mktemp(LFM2_KIND))


@pytest.fixture(scope="module")
def loaded(tiny: TinyModel) -> LoadedModel:
    return loaded_float32(tiny)


def test_conv_layers_get_the_conv_class_and_attention_layers_the_decoders(loaded):
    assert type(loaded.model) is Lfm2ForCausalLM
    kinds = [isinstance(layer, ShortConvLayer) for layer in loaded.model.layers]
    assert kinds == [True, False, True, True]
    note = describe_family(loaded.model_config)
    assert "3 of its 4 layers are short convolutions over a per-sequence state" in note


def test_logits_of_a_prefill_a_chunk_and_a_decode_match_transformers(loaded, tiny):
    prompt = random_prompts(1, seed=5)[0] + [9, 10, 11]
    runner = PagedRunner(loaded.model)
    table: list[int] = []
    first = runner.step([prompt[:-3]], [0], [table])
    chunk = runner.step([prompt[-3:-1]], [len(prompt) - 3], [table])  # the conv tail carried
    decode = runner.step([prompt[-1:]], [len(prompt) - 1], [table])
    reference = hf_logits(tiny, prompt)
    assert_close_to_scale(first, reference[-4:-3], 1e-5)
    assert_close_to_scale(chunk, reference[-2:-1], 1e-5)
    assert_close_to_scale(decode, reference[-1:], 1e-5)


def test_greedy_tokens_through_the_engine_match_transformers_generate(loaded, tiny):
    prompts = random_prompts(3, seed=7)
    ours = run(make_core(loaded), prompts)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            generated = tiny.hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24
            )[0]
        assert ours[i] == (generated[len(prompt) :].tolist(), "length")


@pytest.mark.parametrize("budget", [7, 64])
def test_chunked_prefill_gives_the_same_tokens_as_whole_prompts(loaded, budget):
    check_chunked_prefill_equals_whole_prompts(loaded, budget)


def test_a_prefix_cache_hit_starts_from_the_snapshot_and_gives_the_same_tokens(loaded):
    check_prefix_cache_hit_equals_cold(loaded)


def test_preempted_requests_resume_with_the_same_greedy_tokens(loaded):
    core = check_preemption_resumes_exactly(loaded, num_prompts=12, num_blocks=40)
    assert core.scheduler.states is not None
    assert core.scheduler.states.num_free_slots == core.scheduler.states.num_slots


def test_speculation_rolls_rejected_drafts_out_of_the_state(loaded, tiny):
    """Some drafts are rejected, so states roll back, and no greedy token changes."""
    check_speculation_keeps_greedy_tokens(loaded, tiny, lengths=(20, 45, 70))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["conv", "mamba", "conv", "conv"]}, "unsupported LFM2 layer type 'mamba'"),
        ({"conv_L_cache": 1}, "unsupported conv_L_cache 1"),
        ({"layer_types": ["conv"]}, "layer_types names 1 layers, the model has 4"),
    ],
)
def test_a_layer_type_or_state_shape_it_cannot_run_is_one_line(tiny, change, message):
    with pytest.raises(ModelLoadError, match=message):
        parse_hf_config(tiny.config_dict | change)


def test_sluice_serve_refuses_a_layer_type_it_cannot_run_with_exit_status_2(tiny, tmp_path, capsys):
    config = tiny.config_dict | {"layer_types": ["conv", "full_attention", "mamba", "conv"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tiny_tokenizer(tmp_path, num_tokens=512)
    status = main(["serve", "--model", str(tmp_path), "--port", "0", "--in-process"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert "unsupported LFM2 layer type 'mamba'" in err


def test_an_lfm2_gguf_as_llama_cpp_writes_it_generates_like_transformers(loaded, tiny, tmp_path):
    path = write_tiny_lfm2_gguf(tiny, tmp_path / "lfm2.gguf", loaded.model_config.intermediate_size)
    config = ModelConfig(model=str(path), cache_dir=tmp_path / "cache", dtype="float32")
    from_gguf = load_model(config)
    gguf_config = from_gguf.model_config
    assert gguf_config.rms_norm_eps == pytest.approx(1e-5)  # a float32 in the metadata
    assert replace(gguf_config, rms_norm_eps=1e-5) == loaded.model_config
    prompts = random_prompts(2, seed=9)
    assert run(make_core(from_gguf), prompts) == run(make_core(loaded), prompts)


@pytest.mark.slow
def test_the_default_path_gives_the_same_tokens_chunked_cached_and_speculating(tiny, tmp_path):
    """As `sluice serve` loads it: bfloat16 with the row-invariant int8 matmuls
    (where the CPU has AVX512-VNNI), speculation on. A row's bits ignore its
    step, so chunking, prefix hits and verified drafts change no token."""
    write_tiny_tokenizer(tiny.path, num_tokens=512)
    default = load_model(ModelConfig(model=str(tiny.path), cache_dir=tmp_path))
    if "avx512_vnni" not in cpu_flags():
        pytest.skip("the row-invariant default needs AVX512-VNNI")
    assert default.choices.row_invariant
    prompts = random_prompts(8, seed=2)
    whole = run(make_core(default, budget=512, chunked=False), prompts)
    assert run(make_core(default, budget=7), prompts) == whole
    assert run(make_core(default, prefix_caching=False), prompts) == whole
    rng = random.Random(5)
    repeating = [repeating_prompt(rng, length) for length in (20, 45, 70)]
    speculating = make_core(default, speculative=ngram(k=4))
    drafted = run_speculating(speculating, repeating)
    plain = run_speculating(make_core(default), repeating)
    assert {i: r[:2] for i, r in drafted.items()} == {i: r[:2] for i, r in plain.items()}
    counters = speculating.speculator.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens


def test_without_prefix_caching_the_conv_layers_keep_no_snapshots(loaded):
    """Nothing reads a snapshot without prefix caching: the conv layers hold
    only their live states, and a block costs its K/V alone."""
    core = make_core(loaded, prefix_caching=False, max_seqs=5)
    conv_rows = [cache.shape[0] for cache in core.runner.kv_caches if cache.dim() == 3]
    assert conv_rows == [5, 5, 5]
    config = loaded.model_config
    with_snapshots = kv_cache_bytes_per_block(config, 4, torch.float32)
    without = kv_cache_bytes_per_block(config, 4, torch.float32, with_snapshots=False)
    assert with_snapshots - without == 3 * 2 * config.hidden_size * 4
    prompts = random_prompts(6, seed=4)
    chunked = run(make_core(loaded, prefix_caching=False, budget=7, max_seqs=5), prompts)
    assert chunked == run(make_core(loaded, budget=512, chunked=False), prompts)
