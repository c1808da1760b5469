"""`sluice serve` on tiny random Qwen3, Gemma 3 and Qwen3-MoE folders, as users run it:
the startup line names the family and what it cannot use, and a greedy
completion over HTTP gives the text of transformers' greedy tokens."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from sluice.testing.server_process import sluice_serve
from sluice.tokenizer import Tokenizer
from tests.model_factory import (
    GEMMA3_KIND,
    GEMMA4_KIND,
    LFM2_KIND,
    QWEN3_MOE_KIND,
    SMOLLM3_KIND,
    build_tiny_model,
    write_tiny_tokenizer,
)

pytestmark = pytest.mark.slow

STARTUP_LINES = {
    "qwen3_tied": "architecture Qwen3ForCausalLM: every engine path",
    GEMMA3_KIND: "architecture Gemma3ForCausalLM: its sliding-window layers (window 8) "
    "attend on the torch path",
    LFM2_KIND: "architecture Lfm2ForCausalLM: 3 of its 4 layers are short convolutions over a "
    "per-sequence state",
    QWEN3_MOE_KIND: "architecture Qwen3MoeForCausalLM: its MoE layers run the experts grouped "
    "by expert (moe.py: in the model dtype on tiles of 8 rows, or kept in the file's GGUF or MXFP4 "
    "blocks on their kernels), not the fused native decode call nor int8 weights; mixture of experts: 8 experts, 2 per token; 226.85K parameters, 153.12K active; "
    "expert weights 0.4 MiB in float32",
    SMOLLM3_KIND: "architecture SmolLM3ForCausalLM: every engine path",
    GEMMA4_KIND: "architecture Gemma4ForCausalLM: its sliding-window layers (window 8) attend "
    "on the torch path, not the native attention kernels, and keep all their KV blocks; q and k "
    "rotate on the torch path, not the native RoPE + K/V-write kernel; its last 2 layers attend "
    "over earlier layers' K/V and hold none of their own",
}
PROMPT = "the quick brown fox"
# The tiny Qwen3-MoE's 8 greedy tokens after PROMPT end inside a UTF-8
# character, which a finished completion's text leaves out.
PROMPTS = {QWEN3_MOE_KIND: "the quick brown fox jumps"}


@pytest.mark.parametrize("kind", sorted(STARTUP_LINES))
def test_sluice_serve_runs_the_family_and_says_so_at_startup(kind, tmp_path):
    folder = tmp_path / kind
    tiny = build_tiny_model(kind, folder)
    write_tiny_tokenizer(folder, num_tokens=512)
    tokenizer = Tokenizer.from_folder(folder)
    prompt = PROMPTS.get(kind, PROMPT)
    prompt_ids = tokenizer.encode(prompt)
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(8):
            ids.append(int(tiny.hf_model(torch.tensor([ids])).logits[0, -1].argmax()))
    log_path = tmp_path / "serve.log"
    args = ("--model", str(folder), "--cache-dir", str(tmp_path / "cache"), "--dtype", "float32")
    with sluice_serve(*args, log_path=log_path, startup_timeout_s=240) as url:
        body = {"model": kind, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
    assert STARTUP_LINES[kind] in log_path.read_text()
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["choices"][0]["text"] == tokenizer.decode(ids[len(prompt_ids) :])
