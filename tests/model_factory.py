"""Tiny random Hugging Face models for tests, built with transformers and saved locally.

Each kind is a Llama-family shape small enough to run in milliseconds
(hidden 64, 2 layers, 4 query heads over 2 KV heads, vocab 512). Weights come
from a fixed seed, and every tensor, norms and biases included, is drawn at
random: transformers initialises norms to one and biases to zero, which would
let a loader that skips them pass a parity test. The scale (std 0.1) makes
the logits spread widely enough that greedy decoding never hangs on a near tie.

Use from a fixture:

    @pytest.fixture(scope="module", params=TINY_MODEL_KINDS)
    def tiny(request, tmp_path_factory):
        return build_tiny_model(request.param, tmp_path_factory.mktemp(request.param))

The engine tests share one, loaded (`tiny_llama`, `tiny_loaded` in conftest.py),
and build engine cores on it with `make_core`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from sluice.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from sluice.engine.core import EngineCore
from sluice.loader.loaded_model import LoadedModel
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.families.registry import parse_hf_config
from sluice.models.llama import LlamaForCausalLM
from sluice.tokenizer import _unicode_to_byte

# Llama tied; Llama untied with llama3 rope scaling; Qwen2 with q/k/v bias (tied,
# like Qwen2.5-0.5B); Mistral untied with its window switched off; Qwen3 with
# its q/k norms, tied (like Qwen3-0.6B) and untied (like Qwen3-4B); Phi-3 with
# its fused checkpoint matrices and every layer within a window of 8; SmolLM3
# with its fourth layer unrotated (NoPE).
TINY_MODEL_KINDS = (
    "llama_tied", "llama3_untied", "qwen2_bias", "mistral", "qwen3_tied", "qwen3_untied",
    "phi3_window", "smollm3",
)  # fmt: skip
# Gemma 3 (text) runs in its own class (sluice/models/gemma3.py): a sliding
# layer (window 8, local RoPE base) before a global one, a query scalar other
# than head_dim and logit soft-capping, so that each of them shows.
GEMMA3_KIND = "gemma3"
# Gemma 2: the same layout without q/k norms, sliding and global layers in
# turn, attention scores capped (at 1.0, so that the cap shows on these scores).
GEMMA2_KIND = "gemma2"
GEMMA3_SLIDING_WINDOW = 8
# Phi-3 with LongRoPE (Phi-3.5-mini's scaling) over an original context of 16
# positions, so that a test prompt can be shorter or longer than it. Not in
# TINY_MODEL_KINDS: transformers switches factor lists with the prompt's
# length, sluice once per server (sluice/models/longrope.py).
PHI3_LONGROPE_KIND = "phi3_longrope"
PHI3_LONGROPE_ORIGINAL = 16
# Phi-4-mini's partial rotary (partial_rotary_factor 0.75: RoPE on 12 of the
# 16 dims of a head), alone and with LongRoPE as Phi-4-mini has both (6
# factors per list, the original context 16 as above).
PHI3_PARTIAL_KIND = "phi3_partial"
PHI4_MINI_KIND = "phi4_mini"
PARTIAL_ROTARY_FACTOR = 0.75
# SmolLM3: four layers, the fourth without RoPE (no_rope_layer_interval 4).
SMOLLM3_KIND = "smollm3"
# YaRN over an original context of 16 positions (factor 16: the model's 256),
# so that test prompts run past it: Llama (beta_fast/slow given) and Qwen3
# (transformers' defaults, as Qwen3's config.json writes it).
LLAMA_YARN_KIND, QWEN3_YARN_KIND = "llama_yarn", "qwen3_yarn"
YARN_ORIGINAL = 16
# Gemma 4 (text): five layers, sliding (window 8) and full in turn as
# [S, F, S, S, F]; full layers with heads of 32 (sliding: 16), one KV head
# and V from k_proj; the last two layers share the K/V of layers 2 and 1 and
# have a double-wide MLP; per-layer embeddings of 8 a layer; logits capped at 5.
GEMMA4_KIND = "gemma4"
# The same text decoder inside a multimodal Gemma4ForConditionalGeneration
# checkpoint, with a one-layer vision tower whose weights sluice skips.
GEMMA4_MULTIMODAL_KIND = "gemma4_multimodal"
# LFM2: short convolutions (kernel 3) around one attention layer, the hybrid
# whose conv layers keep a per-sequence state (sluice/models/short_conv.py).
LFM2_KIND = "lfm2"
# Qwen3.5 (dense text): Gated DeltaNet layers (2 key heads of 16 over 4 value
# heads of 8, conv kernel 4) around one gated attention layer (partial RoPE,
# a quarter of its heads of 16), as [linear, linear, full, linear].
QWEN3_5_KIND = "qwen3_5"
# Qwen3-MoE: 8 experts of width 32, top-2 renormalised, the middle of three
# layers dense (mlp_only_layers); override mlp_only_layers=[] for all sparse.
QWEN3_MOE_KIND = "qwen3_moe"
# Qwen2-MoE: q/k/v bias, 8 experts top-2 not renormalised, a shared expert
# of width 48 behind its sigmoid gate, every layer sparse.
QWEN2_MOE_KIND = "qwen2_moe"

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_INIT_STD = 0.1


@dataclass(slots=True)
class TinyModel:
    kind: str
    # Folder with config.json and model.safetensors.
    path: Path
    # The transformers model, float32, eager attention, in eval mode.
    hf_model: transformers.PreTrainedModel

    @property
    def config_dict(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) pairs as the saved checkpoint holds them."""
        yield from load_file(self.path / "model.safetensors").items()


def tiny_hf_config(kind: str) -> transformers.PretrainedConfig:
    if kind == "llama_tied":
        return transformers.LlamaConfig(**_COMMON, tie_word_embeddings=True, rope_theta=10000.0)
    if kind == "llama3_untied":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return transformers.LlamaConfig(**_COMMON, tie_word_embeddings=False, rope_parameters=rope)
    if kind == "qwen2_bias":
        return transformers.Qwen2Config(**_COMMON, tie_word_embeddings=True, rope_theta=1e6)
    if kind == "mistral":
        return transformers.MistralConfig(
            **_COMMON, tie_word_embeddings=False, sliding_window=None, rope_theta=1e6
        )
    if kind in ("qwen3_tied", "qwen3_untied"):
        return transformers.Qwen3Config(
            **_COMMON, head_dim=32, tie_word_embeddings=kind == "qwen3_tied", rope_theta=1e6
        )
    if kind == "phi3_window":
        return transformers.Phi3Config(
            **_COMMON, pad_token_id=0, sliding_window=8, rope_theta=10000.0,
            tie_word_embeddings=False,
        )  # fmt: skip
    if kind == PHI3_LONGROPE_KIND:
        rope = {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.25 * i for i in range(8)],
            "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0],
        }
        return transformers.Phi3Config(
            **_COMMON, pad_token_id=0, sliding_window=None, rope_scaling=rope,
            original_max_position_embeddings=PHI3_LONGROPE_ORIGINAL, tie_word_embeddings=False,
        )  # fmt: skip
    if kind == PHI3_PARTIAL_KIND:
        return transformers.Phi3Config(
            **_COMMON, pad_token_id=0, sliding_window=None, rope_theta=10000.0,
            partial_rotary_factor=PARTIAL_ROTARY_FACTOR, tie_word_embeddings=False,
        )  # fmt: skip
    if kind == PHI4_MINI_KIND:
        rope = {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.25 * i for i in range(6)],
            "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0],
        }
        return transformers.Phi3Config(
            **_COMMON, pad_token_id=0, sliding_window=None, rope_scaling=rope,
            partial_rotary_factor=PARTIAL_ROTARY_FACTOR,
            original_max_position_embeddings=PHI3_LONGROPE_ORIGINAL, tie_word_embeddings=False,
        )  # fmt: skip
    if kind == SMOLLM3_KIND:
        return transformers.SmolLM3Config(
            **(_COMMON | {"num_hidden_layers": 4, "pad_token_id": 0}),
            rope_theta=2e6,
            tie_word_embeddings=True,
        )
    if kind == LLAMA_YARN_KIND:
        rope = {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "beta_fast": 8.0,
            "beta_slow": 2.0, "original_max_position_embeddings": YARN_ORIGINAL,
        }  # fmt: skip
        return transformers.LlamaConfig(**_COMMON, tie_word_embeddings=False, rope_parameters=rope)
    if kind == QWEN3_YARN_KIND:
        rope = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16}
        return transformers.Qwen3Config(
            **_COMMON, head_dim=32, tie_word_embeddings=True, rope_theta=1e6, rope_scaling=rope
        )
    if kind == QWEN2_MOE_KIND:
        return transformers.Qwen2MoeConfig(
            **_COMMON, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, shared_expert_intermediate_size=48, tie_word_embeddings=False,
            rope_theta=1e6,
        )  # fmt: skip
    if kind == QWEN3_MOE_KIND:
        return transformers.Qwen3MoeConfig(
            **(_COMMON | {"num_hidden_layers": 3}), head_dim=16, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
            tie_word_embeddings=False, rope_theta=1e6,
        )  # fmt: skip
    if kind == QWEN3_5_KIND:
        return transformers.Qwen3_5TextConfig(
            **(_COMMON | {"num_hidden_layers": 4}), head_dim=16, linear_conv_kernel_dim=4,
            linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4, tie_word_embeddings=False,
            layer_types=["linear_attention", "linear_attention", "full_attention",
                         "linear_attention"],
        )  # fmt: skip
    if kind == LFM2_KIND:
        return transformers.Lfm2Config(
            **(_COMMON | {"num_hidden_layers": 4}), norm_eps=1e-5, block_multiple_of=32,
            layer_types=["conv", "full_attention", "conv", "conv"], tie_word_embeddings=True,
        )  # fmt: skip
    if kind == GEMMA4_KIND:
        return transformers.Gemma4TextConfig(
            **(_COMMON | {"num_hidden_layers": 5, "pad_token_id": 0}), head_dim=16,
            global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
            sliding_window=GEMMA3_SLIDING_WINDOW, layer_types=[
                "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                "full_attention",
            ], num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=512, final_logit_softcapping=5.0, tie_word_embeddings=True,
        )  # fmt: skip
    if kind == GEMMA4_MULTIMODAL_KIND:
        vision = transformers.Gemma4VisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, head_dim=8,
        )  # fmt: skip
        return transformers.Gemma4Config(
            text_config=tiny_hf_config(GEMMA4_KIND).to_dict(), vision_config=vision.to_dict(),
            audio_config=None,
        )  # fmt: skip
    if kind == GEMMA2_KIND:
        return transformers.Gemma2Config(
            **(_COMMON | {"num_hidden_layers": 3, "pad_token_id": 0}),
            head_dim=16, query_pre_attn_scalar=24, sliding_window=GEMMA3_SLIDING_WINDOW,
            rope_theta=10000.0, attn_logit_softcapping=1.0, final_logit_softcapping=5.0,
            tie_word_embeddings=True,
        )  # fmt: skip
    if kind == GEMMA3_KIND:
        return transformers.Gemma3TextConfig(
            **(_COMMON | {"num_hidden_layers": 3, "pad_token_id": 0}),
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=GEMMA3_SLIDING_WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            final_logit_softcapping=5.0,
            tie_word_embeddings=True,
        )
    raise ValueError(f"unknown tiny model kind {kind!r}; known: {', '.join(TINY_MODEL_KINDS)}")


def build_tiny_model(kind: str, directory: Path, seed: int = 0, **overrides: Any) -> TinyModel:
    """A random model of `kind`, saved as safetensors into `directory`;
    `overrides` replace config fields (hidden_size=256 gives rows that hold
    whole 256-value K-quant blocks)."""
    config = tiny_hf_config(kind)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + _INIT_STD * torch.randn_like(param))
            else:
                param.normal_(0.0, _INIT_STD)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4's per-layer output scale
                buffer.copy_(1.0 + _INIT_STD * torch.randn_like(buffer))
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return TinyModel(kind=kind, path=Path(directory), hf_model=model)


def load_tiny_llama(tiny: TinyModel, dtype=torch.float32, **changes: Any) -> LlamaForCausalLM:
    """Our decoder on `tiny`'s weights, with `changes` to its parsed config."""
    config = dataclasses.replace(parse_hf_config(tiny.config_dict), **changes)
    model = LlamaForCausalLM(config, dtype, "cpu")
    model.load_weights(tiny.weights())
    return model


def make_core(
    loaded: LoadedModel,
    *,
    num_blocks=512,
    block_size=4,
    budget=64,
    max_seqs=32,
    chunked=True,
    prefix_caching=True,
    speculative: SpeculativeConfig | None = None,
    kv_cache_dtype: str = "auto",
    kv_offload_bytes: int | None = None,
) -> EngineCore:
    """An in-process engine core on `loaded` (the `tiny_loaded` fixture), a
    pool of `num_blocks` blocks in the model's dtype (or int8: `kv_cache_dtype`);
    `speculative`: n-gram speculation, off by default."""
    kv_dtype = torch.int8 if kv_cache_dtype == "int8" else torch.float32
    bytes_per_block = kv_cache_bytes_per_block(
        loaded.model_config, block_size, torch.float32, kv_dtype=kv_dtype
    )
    config = EngineConfig(
        cache=CacheConfig(
            block_size_tokens=block_size,
            kv_cache_memory_bytes=num_blocks * bytes_per_block,
            enable_prefix_caching=prefix_caching,
            kv_cache_dtype=kv_cache_dtype,
            kv_offload_bytes=kv_offload_bytes,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget, max_num_seqs=max_seqs, enable_chunked_prefill=chunked
        ),
        multiprocess=False,
        speculative_config=speculative,
    )
    return EngineCore(config, loaded=loaded)


def write_tiny_tokenizer(folder: Path, num_tokens: int = 259, *, adds_bos: bool = False) -> None:
    """A byte-level BPE tokenizer: <unk>, <s>, </s>, then the 256 byte symbols.
    `adds_bos`: encoding with special tokens prepends <s>, as Llama's tokenizers do."""
    table = _unicode_to_byte()
    symbols = ["<unk>", "<s>", "</s>", *sorted(table, key=table.__getitem__)]
    symbols += [f"extra{i}" for i in range(num_tokens - len(symbols))]
    backend = BackendTokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    backend.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(special))
