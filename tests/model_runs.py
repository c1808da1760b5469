"""Running tiny models in tests: a minimal paged runner, transformers' side of
a parity check, and the engine-core loops the engine and family tests share.

Test modules import these from here, never from one another
(tests/test_import_cycles.py).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.choices import ModelChoices
from sluice.loader.loaded_model import LoadedModel
from sluice.models.attention import AttentionMetadata, allocate_kv_caches
from sluice.models.families.registry import build_model, parse_hf_config
from sluice.models.llama import LlamaForCausalLM
from tests.model_factory import TinyModel

BLOCK_SIZE = 4
NUM_BLOCKS = 96


@dataclass(slots=True)
class PagedRunner:
    """A minimal engine: hands out blocks in reverse order and runs whole steps."""

    model: LlamaForCausalLM
    kv_caches: list[torch.Tensor] = field(default_factory=list)
    free_blocks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kv_caches = allocate_kv_caches(
            self.model.config, NUM_BLOCKS, BLOCK_SIZE, self.model.dtype, "cpu"
        )
        # Reversed and interleaved so that no table is contiguous.
        self.free_blocks = list(range(1, NUM_BLOCKS, 2)) + list(range(2, NUM_BLOCKS, 2))

    def grow(self, table: list[int], seq_len: int) -> None:
        while len(table) * BLOCK_SIZE < seq_len:
            table.append(self.free_blocks.pop())

    @torch.inference_mode()
    def step(
        self, chunks: list[list[int]], context_lens: list[int], tables: list[list[int]]
    ) -> torch.Tensor:  # [B, vocab] logits of each sequence's last new token
        for chunk, context_len, table in zip(chunks, context_lens, tables, strict=True):
            self.grow(table, context_len + len(chunk))
        query_lens = [len(c) for c in chunks]
        meta = AttentionMetadata.build(query_lens, context_lens, tables, BLOCK_SIZE, "cpu")
        input_ids = torch.tensor([t for c in chunks for t in c])
        positions = torch.cat(
            [torch.arange(c, c + n) for c, n in zip(context_lens, query_lens, strict=True)]
        )
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [T, hidden]
        return self.model.compute_logits(hidden[meta.query_start_loc[1:] - 1])


def loaded_float32(tiny: TinyModel) -> LoadedModel:
    """`tiny` built by its family's class in float32 and loaded, as the engine gets a model."""
    config = parse_hf_config(tiny.config_dict)
    model = build_model(config, torch.float32, torch.device("cpu"), False)
    model.load_weights(tiny.weights())
    return LoadedModel(
        model=model, tokenizer=None, model_config=config,
        max_model_len=config.max_position_embeddings, name=tiny.kind,
        eos_token_ids=frozenset({2}), folder=tiny.path,
        choices=ModelChoices("float32", None, "as asked"),
    )  # fmt: skip


def prompt_logits(model: LlamaForCausalLM, prompt: list[int]) -> torch.Tensor:
    """The logits of every prompt position, prefilled in one step."""
    runner = PagedRunner(model)
    table = list(range(1, 1 + math.ceil(len(prompt) / BLOCK_SIZE)))
    meta = AttentionMetadata.build([len(prompt)], [0], [table], BLOCK_SIZE, "cpu")
    with torch.inference_mode():
        hidden = model(torch.tensor(prompt), torch.arange(len(prompt)), runner.kv_caches, meta)
        return model.compute_logits(hidden)  # [len(prompt), vocab]


def greedy(runner: PagedRunner, prompt: list[int], num_new: int) -> list[int]:
    table: list[int] = []
    logits = runner.step([prompt], [0], [table])
    out = [int(logits[0].argmax())]
    for _ in range(num_new - 1):
        logits = runner.step([[out[-1]]], [len(prompt) + len(out) - 1], [table])
        out.append(int(logits[0].argmax()))
    return out


@torch.no_grad()
def hf_logits(tiny: TinyModel, prompt: list[int]) -> torch.Tensor:  # [len(prompt), vocab]
    return tiny.hf_model(torch.tensor([prompt])).logits[0]


def assert_close_to_scale(ours: torch.Tensor, reference: torch.Tensor, rel: float) -> None:
    scale = reference.abs().max().item()
    diff = (ours - reference).abs().max().item()
    assert diff <= rel * scale, f"max |diff| {diff:.3g} exceeds {rel:g} x logit scale {scale:.3g}"


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def random_prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(3, 60))] for _ in range(count)]


def run(core: EngineCore, prompts, params=GREEDY, abort_at: dict[int, int] | None = None):
    """Run prompts to completion; returns request index -> (token ids, finish reason)."""
    for i, prompt in enumerate(prompts):
        core.add_request(
            generation_request(
                f"r{i}", prompt, params if isinstance(params, SamplingParams) else params[i]
            )
        )
    tokens = {i: [] for i in range(len(prompts))}
    finish: dict[int, str] = {}
    step = 0
    while core.has_unfinished_requests():
        for index, at_step in (abort_at or {}).items():
            if at_step == step:
                for delta in core.abort_requests([f"r{index}"]):
                    finish[int(delta.request_id[1:])] = delta.finish_reason
        for delta in core.step():
            index = int(delta.request_id[1:])
            assert index not in finish, "a delta arrived after the request finished"
            tokens[index].extend(delta.new_token_ids)
            if delta.finish_reason is not None:
                finish[index] = delta.finish_reason
        step += 1
    return {i: (tokens[i], finish.get(i)) for i in tokens}


def run_one_by_one(core: EngineCore, prompts, params) -> list[tuple[list[int], list[float], int]]:
    """Each prompt alone, one after the other: (tokens, logprobs, cached tokens)."""
    results = []
    for index, prompt in enumerate(prompts):
        core.add_request(generation_request(f"s{index}", prompt, params))
        tokens, logprobs, cached = [], [], 0
        while core.has_unfinished_requests():
            for delta in core.step():
                tokens.extend(delta.new_token_ids)
                logprobs.extend(delta.logprobs.logprobs)
                cached = delta.num_cached_tokens
        results.append((tokens, logprobs, cached))
    return results
