"""gpt-oss's expert stacks from a GGUF, in OpenAI's release layout: `release_experts`.

llama.cpp's converter (convert_hf_to_gguf.py, GptOssModel) takes each
layer's `gate_up_proj` apart into `ffn_gate_exps` and `ffn_up_exps`
([E, I, H]: the even rows, then the odd ones), stores `ffn_down_exps`
[E, H, I], each with its bias ([E, I], [E, H]), and writes MXFP4 stacks as
ggml's blocks: per 32 inputs the E8M0 exponent byte, then 16 bytes whose
low nibbles hold values 0-15 and high nibbles values 16-31 (OpenAI's
`*_blocks` hold values 2j and 2j+1 in byte j, low nibble first).

`release_experts` turns them back into the tensors OpenAI publishes:

    model.layers.N.mlp.experts.gate_up_proj_blocks   [E, 2 I, H / 32, 16]  gate, up rows in turn
    model.layers.N.mlp.experts.gate_up_proj_scales   [E, 2 I, H / 32]
    model.layers.N.mlp.experts.gate_up_proj_bias     [E, 2 I]              the same turns
    model.layers.N.mlp.experts.down_proj_blocks      [E, H, I / 32, 16]
    model.layers.N.mlp.experts.down_proj_scales      [E, H, I / 32]
    model.layers.N.mlp.experts.down_proj_bias        [E, H]

(a stack in another type as transformers holds it, float32 `gate_up_proj`
[E, H, 2 I] or `down_proj` [E, I, H]), which models/gpt_oss.py loads as it
loads an HF folder: MXFP4 stays in 4 bits there. The codes and exponents are
the file's bits, moved, never rounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from sluice.errors import ModelLoadError
from sluice.loader import gguf_llama
from sluice.loader.gguf_llama import family, hf_array, model_tensors
from sluice.models.families.family import GgufFamily

MXFP4 = "MXFP4"
# A GGUF expert stack's MXFP4 group: the exponent byte, then 16 code bytes.
GROUP_BYTES = 17
# The HF names families/gpt_oss.py gives llama.cpp's expert stacks.
_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(gate|up|down)_proj\.(weight|bias)")
_SINKS = re.compile(r"model\.layers\.\d+\.self_attn\.sinks\.weight")
_PARTS = tuple((proj, kind) for proj in ("gate", "up", "down") for kind in ("weight", "bias"))


def hf_tensors(reader: Any, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """`gguf_llama.hf_tensors`, with a `release_experts` family's expert stacks
    in OpenAI's release layout (after the other tensors)."""
    gguf = family(reader).gguf
    assert gguf is not None, "the registry finds only families with a GGUF layout"
    if not gguf.release_experts:
        yield from gguf_llama.hf_tensors(reader, config)
        return
    experts = []  # (tensor, HF name): views of the map until the end
    for tensor, name, heads in model_tensors(reader, config):
        if is_expert_stack(name):
            experts.append((tensor, name))
        else:
            yield release_name(name), hf_array(tensor, name, heads, gguf)
    yield from release_experts(experts, gguf)


def release_name(hf_name: str) -> str:
    """A tensor's name in the release: the converter calls the sinks
    `attn_sinks.weight`; transformers' parameter is `self_attn.sinks`."""
    return hf_name.removesuffix(".weight") if _SINKS.fullmatch(hf_name) else hf_name


def is_expert_stack(hf_name: str) -> bool:
    """Whether `hf_name` is one of a layer's expert stacks (or their biases)."""
    return _EXPERT.fullmatch(hf_name) is not None


def release_experts(
    experts: list[tuple[Any, str]], gguf: GgufFamily
) -> Iterator[tuple[str, np.ndarray]]:
    """(release name, array) for every layer's experts, from (GGUF tensor, its
    HF name) pairs; ModelLoadError (one line) for a layer missing a part."""
    layers: dict[str, dict[tuple[str, str], Any]] = {}
    for tensor, name in experts:
        match = _EXPERT.fullmatch(name)
        assert match is not None, f"{name} is not an expert stack"
        layers.setdefault(match[1], {})[match[2], match[3]] = tensor
    for prefix, parts in layers.items():
        missing = [f"{proj}_proj.{kind}" for proj, kind in _PARTS if (proj, kind) not in parts]
        if missing:
            raise ModelLoadError(f"GGUF gpt-oss experts {prefix} lack {', '.join(missing)}")
        yield from _layer(prefix, parts, gguf)


def _layer(
    prefix: str, parts: dict[tuple[str, str], Any], gguf: GgufFamily
) -> Iterator[tuple[str, np.ndarray]]:
    def floats(proj: str, kind: str) -> np.ndarray:
        # A copy: an F32 tensor's array is a view of the read-only map.
        return hf_array(parts[proj, kind], f"{prefix}{proj}_proj.{kind}", None, gguf).copy()

    gate, up, down = parts["gate", "weight"], parts["up", "weight"], parts["down", "weight"]
    if gate.tensor_type.name == up.tensor_type.name == MXFP4:
        (gate_blocks, gate_scales), (up_blocks, up_scales) = (
            release_blocks(gate),
            release_blocks(up),
        )
        yield prefix + "gate_up_proj_blocks", interleave_rows(gate_blocks, up_blocks)
        yield prefix + "gate_up_proj_scales", interleave_rows(gate_scales, up_scales)
    else:  # [E, 2 I, H] -> transformers' [E, H, 2 I]
        gate_up = interleave_rows(floats("gate", "weight"), floats("up", "weight"))
        yield prefix + "gate_up_proj", np.ascontiguousarray(gate_up.transpose(0, 2, 1))
    yield (
        prefix + "gate_up_proj_bias",
        interleave_rows(floats("gate", "bias"), floats("up", "bias")),
    )
    if down.tensor_type.name == MXFP4:
        down_blocks, down_scales = release_blocks(down)
        yield prefix + "down_proj_blocks", down_blocks
        yield prefix + "down_proj_scales", down_scales
    else:  # [E, H, I] -> transformers' [E, I, H]
        yield (
            prefix + "down_proj",
            np.ascontiguousarray(floats("down", "weight").transpose(0, 2, 1)),
        )
    yield prefix + "down_proj_bias", floats("down", "bias")


def release_blocks(tensor: Any) -> tuple[np.ndarray, np.ndarray]:
    """An MXFP4 stack [E, rows, cols] as OpenAI's (blocks [E, rows, cols / 32, 16]
    uint8, two values a byte in order, low nibble first; scales [E, rows, cols / 32])."""
    if len(tensor.shape) != 3 or int(tensor.shape[0]) % 32:
        raise ModelLoadError(
            f"GGUF MXFP4 tensor {tensor.name} has shape {[int(n) for n in tensor.shape]}, "
            "not a stack of experts with rows of whole 32-value groups"
        )
    experts, rows = int(tensor.shape[2]), int(tensor.shape[1])
    groups = np.asarray(tensor.data, dtype=np.uint8).reshape(experts, rows, -1, GROUP_BYTES)
    codes = groups[..., 1:]  # [E, rows, G, 16]: value j low, value j + 16 high
    values = np.concatenate([codes & 0x0F, codes >> 4], axis=-1)  # [E, rows, G, 32] in order
    blocks = values[..., 0::2] | (values[..., 1::2] << 4)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(groups[..., 0])


def interleave_rows(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """[E, n, ...] twice -> [E, 2 n, ...]: first's row 0, second's row 0, ... (the
    converter took `gate_up_proj` apart at even and odd rows)."""
    stacked = np.stack([first, second], axis=2)  # [E, n, 2, ...]
    return np.ascontiguousarray(stacked.reshape(first.shape[0], -1, *first.shape[2:]))
