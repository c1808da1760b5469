"""Tiny gpt-oss checkpoints for tests: `build_tiny_gpt_oss` (random weights,
every feature that changes the output switched on) and `write_mxfp4_folder`,
which rounds its experts to MXFP4 and saves them as OpenAI publishes
gpt-oss (`*_blocks` / `*_scales`, quantization_config mxfp4), and
`convert_with_llama_cpp`, llama.cpp's converter run on such a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

from sluice.models.mxfp4 import E2M1_VALUES
from tests.model_factory import TinyModel

WINDOW = 8


def build_tiny_gpt_oss(directory: Path, seed: int = 0, **overrides) -> TinyModel:
    """8 experts top-2, the clamp at 1 so it bites, window 8, YaRN past an
    original context of 32, large sinks; `overrides` replace config fields."""
    config = transformers.GptOssConfig(
        hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=WINDOW, swiglu_limit=1.0,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, rope_parameters={
            "rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32,
        },
    )  # fmt: skip
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:  # sinks too: a logit of about one beside scores of about 0.1 shows
                param.normal_(0.0, 1.0 if name.endswith("sinks") else 0.1)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return TinyModel(kind="gpt_oss", path=Path(directory), hf_model=model)


def to_mxfp4(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[E, out, in] -> (blocks [E, out, in / 32, 16], scales [E, out, in / 32], the
    values they hold): each group of 32 scaled by the power of two that fits
    its largest value in 6, then rounded to the nearest E2M1 value."""
    groups = weights.unflatten(-1, (-1, 32))  # [E, out, G, 32]
    exponents = torch.ceil(torch.log2(groups.abs().amax(-1) / 6.0))  # [E, out, G]
    table = torch.tensor(E2M1_VALUES)
    codes = (groups / torch.exp2(exponents)[..., None] - table[:8][:, None, None, None, None]).abs()
    codes = codes.argmin(0)  # [E, out, G, 32]: the nearest magnitude, then the sign bit
    codes = torch.where(groups < 0, codes + 8, codes).to(torch.uint8)
    values = table[codes.long()] * torch.exp2(exponents)[..., None]
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exponents + 127).to(torch.uint8), values.flatten(-2)


def write_mxfp4_folder(tiny: TinyModel, folder: Path) -> dict[str, torch.Tensor]:
    """`tiny` with its experts rounded to MXFP4 (in its transformers model too,
    so it runs the rounded values), saved into `folder` as OpenAI publishes
    gpt-oss; returns the saved tensors."""
    state = dict(tiny.weights())
    with torch.no_grad():
        for index, layer in enumerate(tiny.hf_model.model.layers):
            stem = f"model.layers.{index}.mlp.experts."
            for proj in ("gate_up_proj", "down_proj"):
                param = getattr(layer.mlp.experts, proj)  # [E, in, out]
                blocks, scales, values = to_mxfp4(param.transpose(1, 2))
                param.copy_(values.transpose(1, 2))
                del state[stem + proj]
                state[stem + proj + "_blocks"], state[stem + proj + "_scales"] = blocks, scales
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny.config_dict | {"quantization_config": {"quant_method": "mxfp4"}}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "model.safetensors"))
    return state


# llama.cpp's source tree (the llama-cpp-python sdist's vendor/llama.cpp), whose
# convert_hf_to_gguf.py writes gpt-oss GGUFs.
LLAMA_CPP = Path(
    os.environ.get("SLUICE_LLAMA_CPP", "/work/peers/src/llama_cpp_python-0.3.36/vendor/llama.cpp")
)
# The converter as a subprocess, its vocabulary step replaced: a tiny model has
# no tokenizer the converter knows, so it gets tests/gguf_files.py's byte BPE
# (and the folder's chat_template.jinja, as the real step writes it).
_CONVERT = """
import runpy, sys
sys.path[:0] = [{root!r}, {llama_cpp!r}]
from conversion.gpt_oss import GptOssModel
from tests.gguf_files import add_byte_bpe_vocab
def set_vocab(self):
    specials = ["<|endoftext|>", "<s>", "</s>", "<|return|>", "<|call|>"]  # ids 0-4
    add_byte_bpe_vocab(self.gguf_writer, self.hparams["vocab_size"], specials)
    template = self.dir_model / "chat_template.jinja"  # as the real step copies it
    if template.is_file():
        self.gguf_writer.add_chat_template(template.read_text())
GptOssModel.set_vocab = set_vocab
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


def convert_with_llama_cpp(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """`folder` (an HF gpt-oss checkpoint) through llama.cpp's
    convert_hf_to_gguf.py: every tensor and the metadata as it writes them."""
    script = LLAMA_CPP / "convert_hf_to_gguf.py"
    root = str(Path(__file__).resolve().parent.parent)
    code = _CONVERT.format(root=root, llama_cpp=str(LLAMA_CPP), script=str(script))
    command = [sys.executable, "-c", code, str(folder), "--outfile", str(out), "--outtype", outtype]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def gpt_oss_template() -> str:
    """gpt-oss's harmony chat template (llama.cpp's models/templates copy)."""
    return (LLAMA_CPP / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text()
