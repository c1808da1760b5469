"""The embedded model through our loader and model code vs transformers.

Two references, all float32 on CPU:
1. transformers' own Llama loaded from the converted folder: prompt logits
   agree within LOGIT_ATOL and a greedy continuation matches token for token;
2. transformers' GGUF reader (`load_gguf_checkpoint`, the code behind
   `from_pretrained(gguf_file=...)`, called directly because that entry point
   also wants `accelerate`, which sluice does not depend on): its dequantized,
   un-permuted tensors equal our converted ones bit for bit, so a transformers
   model loaded from the GGUF computes exactly the logits of reference 1 --
   proof of the q/k un-permutation (a transposed head layout would change
   every attention score).

LOGIT_ATOL: both sides compute in float32 but in different orders (our q/k/v
and gate/up matmuls are fused, attention reads a paged cache instead of SDPA
over contiguous tensors); over 30 layers that leaves differences of order
1e-5 on logits up to ~38 in magnitude (measured max 7.4e-5 on this prompt).
Leaving q/k in llama.cpp's permuted layout moves them by up to 35 (measured),
so 2e-3 separates right from wrong by four orders of magnitude either way.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from sluice.loader import LoadedModel, load_model
from sluice.loader.sources import embedded_gguf_path
from sluice.models.attention import AttentionMetadata, allocate_kv_caches

pytestmark = pytest.mark.slow

LOGIT_ATOL = 2e-3
NUM_NEW_TOKENS = 32
BLOCK_SIZE = 16
MESSAGES = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


@pytest.fixture(scope="module")
def ours(embedded_model_config) -> LoadedModel:
    return load_model(embedded_model_config)


@pytest.fixture(scope="module")
def theirs(embedded_model_dir):
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompt(ours) -> list[int]:
    return ours.tokenizer.encode(ours.tokenizer.apply_chat_template(MESSAGES))


class PagedGreedy:
    """Greedy decoding over our paged KV cache: one prefill, then one token a step."""

    def __init__(self, loaded: LoadedModel, max_len: int):
        self.model = loaded.model
        num_blocks = -(-max_len // BLOCK_SIZE)
        self.block_table = list(range(num_blocks))
        self.kv_caches = allocate_kv_caches(
            loaded.model_config, num_blocks, BLOCK_SIZE, torch.float32, "cpu"
        )

    @torch.no_grad()
    def logits(self, new_ids: list[int], num_cached: int) -> torch.Tensor:  # [len(new), vocab]
        seq_len = num_cached + len(new_ids)
        table = self.block_table[: -(-seq_len // BLOCK_SIZE)]
        attn = AttentionMetadata.build([len(new_ids)], [num_cached], [table], BLOCK_SIZE, "cpu")
        positions = torch.arange(num_cached, seq_len)  # [len(new)]
        hidden = self.model(torch.tensor(new_ids), positions, self.kv_caches, attn)
        return self.model.compute_logits(hidden)

    def generate(self, prompt: list[int], num_new: int) -> list[int]:
        next_id = int(self.logits(prompt, 0)[-1].argmax())
        generated = [next_id]
        while len(generated) < num_new:
            num_cached = len(prompt) + len(generated) - 1
            next_id = int(self.logits([next_id], num_cached)[-1].argmax())
            generated.append(next_id)
        return generated


def hf_logits(model, prompt: list[int]) -> torch.Tensor:  # [len(prompt), vocab]
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float()


def test_prompt_logits_match_transformers_from_the_converted_folder(ours, theirs, prompt):
    ours_logits = PagedGreedy(ours, len(prompt)).logits(prompt, 0)
    reference = hf_logits(theirs, prompt)
    max_diff = (ours_logits - reference).abs().max().item()
    print(f"max |logit diff| vs transformers (folder): {max_diff:.3g} over {len(prompt)} positions")
    assert max_diff < LOGIT_ATOL
    assert torch.equal(ours_logits.argmax(-1), reference.argmax(-1))


def test_greedy_continuation_matches_transformers_generate(ours, theirs, prompt):
    generated = PagedGreedy(ours, len(prompt) + NUM_NEW_TOKENS).generate(prompt, NUM_NEW_TOKENS)
    with torch.no_grad():
        output = theirs.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NUM_NEW_TOKENS,
            do_sample=False,
        )
    reference = output[0, len(prompt) :].tolist()
    assert len(reference) == NUM_NEW_TOKENS  # the story is longer: no early EOS
    assert generated == reference, ours.tokenizer.decode(generated)


def test_transformers_gguf_reader_yields_exactly_our_converted_tensors(theirs, embedded_model_dir):
    parsed = load_gguf_checkpoint(
        str(embedded_gguf_path()), return_tensors=True, model_to_load=theirs
    )
    reference = {name: torch.as_tensor(t) for name, t in parsed["tensors"].items()}
    converted = load_file(embedded_model_dir / "model.safetensors")
    assert reference.keys() == converted.keys()
    for name, tensor in converted.items():
        assert torch.equal(tensor, reference[name]), name
