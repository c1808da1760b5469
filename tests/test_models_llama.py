"""Our Llama-family model against transformers on the same tiny random weights.

Tolerance, float32: both sides compute the same math in float32 but fuse and
order it differently (one q/k/v matmul, SDPA for prefill), so logits differ by
rounding only: a few ulps per op, under 1e-6 of the logit scale after two
layers (measured: identical bits on this CPU). We allow 1e-4 of the logit
scale (max |logit|, about 3 here), a 100x margin for rounding on other
kernels, while any real mistake (a wrong RoPE frequency, a skipped bias or
norm) moves logits by 1e-2 or more.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from sluice.errors import ModelLoadError
from sluice.models import llama as llama_module
from sluice.models.attention import AttentionMetadata
from sluice.models.families.registry import parse_hf_config
from sluice.models.linear import can_prepack
from sluice.models.llama import LlamaForCausalLM
from sluice.models.rope_norm import rope_cos_sin, rope_inv_freq
from tests.model_factory import (
    TINY_MODEL_KINDS,
    TinyModel,
    build_tiny_model,
    load_tiny_llama,
    tiny_hf_config,
)
from tests.model_runs import BLOCK_SIZE, PagedRunner, assert_close_to_scale, greedy, hf_logits

PROMPT = [1, 17, 300, 45, 9, 88, 211, 5, 402, 77, 3, 150, 64]
NUM_NEW_TOKENS = 32


@pytest.fixture(scope="module", params=TINY_MODEL_KINDS)
def tiny(request, tmp_path_factory) -> TinyModel:
    return build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


def test_prompt_logits_match_transformers_at_every_position(tiny):
    runner = PagedRunner(load_tiny_llama(tiny))
    meta = AttentionMetadata.build([len(PROMPT)], [0], [list(range(1, 5))], BLOCK_SIZE, "cpu")
    with torch.inference_mode():
        hidden = runner.model(
            torch.tensor(PROMPT), torch.arange(len(PROMPT)), runner.kv_caches, meta
        )
        logits = runner.model.compute_logits(hidden)  # [len(PROMPT), vocab]
    assert logits.dtype == torch.float32
    assert_close_to_scale(logits, hf_logits(tiny, PROMPT), 1e-4)


def test_greedy_continuation_over_the_paged_cache_matches_transformers_generate(tiny):
    ours = greedy(PagedRunner(load_tiny_llama(tiny)), PROMPT, NUM_NEW_TOKENS)
    with torch.no_grad():
        generated = tiny.hf_model.generate(
            torch.tensor([PROMPT]),
            do_sample=False,
            max_new_tokens=NUM_NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert ours == generated[0, len(PROMPT) :].tolist()


def test_two_sequences_in_one_batch_give_the_logits_each_gives_alone(tiny):
    model = load_tiny_llama(tiny)
    short, long = PROMPT[:5], PROMPT
    alone = [PagedRunner(model).step([p], [0], [[]])[0] for p in (short, long)]
    together = PagedRunner(model).step([short, long], [0, 0], [[], []])
    torch.testing.assert_close(together, torch.stack(alone), atol=1e-5, rtol=1e-5)


def test_mixed_step_of_a_decode_and_a_chunked_prefill_matches_transformers(tiny):
    runner = PagedRunner(load_tiny_llama(tiny))
    first, second = PROMPT[:6], PROMPT[3:]
    tables: list[list[int]] = [[], []]
    runner.step([first, second[:4]], [0, 0], tables)
    # Sequence 0 decodes one token while sequence 1 prefills the rest of its prompt.
    logits = runner.step([[99], second[4:]], [len(first), 4], tables)
    torch.testing.assert_close(logits[0], hf_logits(tiny, first + [99])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], hf_logits(tiny, second)[-1], atol=1e-4, rtol=1e-4)


def test_bfloat16_model_runs_and_stays_near_float32(tiny):
    reference = PagedRunner(load_tiny_llama(tiny)).step([PROMPT], [0], [[]])[0]
    bf16 = PagedRunner(load_tiny_llama(tiny, torch.bfloat16)).step([PROMPT], [0], [[]])[0]
    assert bf16.dtype == torch.float32
    # bfloat16 keeps 8 mantissa bits (relative step 2^-8 = 0.4%); over two layers
    # the error grows to a few percent of the logit scale.
    assert_close_to_scale(bf16, reference, 5e-2)


@pytest.mark.parametrize("kind", ["llama_tied", "llama3_untied"])
def test_rope_tables_match_transformers_rotary_embedding(kind):
    hf_config = tiny_hf_config(kind)
    config = parse_hf_config(hf_config.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    cos, sin = rope_cos_sin(config, torch.float32, "cpu")

    positions = torch.arange(config.max_position_embeddings)[None]
    hf_cos, hf_sin = LlamaRotaryEmbedding(hf_config)(torch.zeros(1), positions)
    half = config.head_dim // 2
    torch.testing.assert_close(cos, hf_cos[0, :, :half], atol=0, rtol=0)
    torch.testing.assert_close(sin, hf_sin[0, :, :half], atol=0, rtol=0)


def test_linear_rope_scaling_divides_the_frequencies_by_the_factor():
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 32}
    base |= {"intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}
    base |= {"max_position_embeddings": 64}
    plain = rope_inv_freq(parse_hf_config(base))
    linear = rope_inv_freq(
        parse_hf_config(base | {"rope_scaling": {"type": "linear", "factor": 4.0}})
    )
    torch.testing.assert_close(linear, plain / 4.0)


def test_load_weights_names_a_missing_tensor(tiny):
    model = LlamaForCausalLM(parse_hf_config(tiny.config_dict), torch.float32, "cpu")
    weights = [(n, t) for n, t in tiny.weights() if n != "model.layers.1.mlp.down_proj.weight"]
    with pytest.raises(ModelLoadError, match=r"missing model\.layers\.1\.mlp\.down_proj\.weight"):
        model.load_weights(weights)


def test_load_weights_names_an_unexpected_tensor_and_ignores_rotary_buffers(tiny):
    model = LlamaForCausalLM(parse_hf_config(tiny.config_dict), torch.float32, "cpu")
    extra = [
        ("model.layers.0.self_attn.rotary_emb.inv_freq", torch.zeros(8)),
        ("model.layers.0.mlp.extra.weight", torch.zeros(2)),
    ]
    with pytest.raises(
        ModelLoadError, match=r"missing none; unexpected model\.layers\.0\.mlp\.extra"
    ):
        model.load_weights([*tiny.weights(), *extra])


def test_load_weights_refuses_a_tensor_of_the_wrong_shape(tiny):
    model = LlamaForCausalLM(parse_hf_config(tiny.config_dict), torch.float32, "cpu")
    weights = dict(tiny.weights())
    weights["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight has shape \(3,\)"):
        model.load_weights(weights.items())


def test_prepacked_bfloat16_matmuls_give_the_same_logits_as_plain_ones(tiny, monkeypatch):
    packed = load_tiny_llama(tiny, torch.bfloat16)
    assert packed.layers[0].qkv_proj.is_prepacked == can_prepack(torch.bfloat16, "cpu")
    monkeypatch.setattr(llama_module, "can_prepack", lambda dtype, device: False)
    plain = load_tiny_llama(tiny, torch.bfloat16)
    assert not plain.layers[0].qkv_proj.is_prepacked
    batch = ([PROMPT, PROMPT[:5]], [0, 0])
    assert torch.equal(
        PagedRunner(packed).step(*batch, [[], []]), PagedRunner(plain).step(*batch, [[], []])
    )


def test_loading_weights_twice_is_refused(tiny):
    model = load_tiny_llama(tiny)
    with pytest.raises(ModelLoadError, match="already loaded"):
        model.load_weights(tiny.weights())
