"""SmolLM3: Llama's decoder with no rotary embedding on some layers (NoPE).

`no_rope_layers` holds 1 for a layer that rotates q and k, 0 for one that
does not; without it, every `no_rope_layer_interval`-th layer (4: layers
3, 7, 11, ...) is a NoPE layer, as transformers' `SmolLM3Config` derives it.
Those layers run on angle 0 (`DecoderConfig.nope_layers`), so every engine
path serves them unchanged. With `use_sliding_window`, the NoPE layers are
the sliding ones (`layer_types`, as transformers derives it). llama.cpp
writes SmolLM3 as `smollm3`, q/k permuted as Llama's, and fixes the interval
at 4 in code.
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, SLIDING, DecoderConfig
from sluice.models.families.family import Family, GgufFamily, GgufMeta
from sluice.models.families.hf_fields import check_swiglu, common_fields
from sluice.models.llama import LlamaForCausalLM

ARCHITECTURE = "SmolLM3ForCausalLM"
# SmolLM3Config's defaults where config.json says nothing.
_DEFAULTS = {"rope_theta": 2_000_000.0, "tie_word_embeddings": True, "no_rope_layer_interval": 4}


def parse_smollm3(d: dict[str, Any]) -> DecoderConfig:
    check_swiglu(d)
    d = _DEFAULTS | {key: value for key, value in d.items() if value is not None}
    fields = common_fields(d, ARCHITECTURE)
    num_layers = fields["num_hidden_layers"]
    uses_rope = _uses_rope(d, num_layers)
    fields["layer_types"] = _layer_types(d, uses_rope, fields["max_position_embeddings"])
    if SLIDING in fields["layer_types"]:
        fields["sliding_window"] = int(d["sliding_window"])
    nope_layers = tuple(index for index, rotates in enumerate(uses_rope) if not rotates)
    return DecoderConfig(**fields, nope_layers=nope_layers)


def _uses_rope(d: dict[str, Any], num_layers: int) -> list[bool]:
    flags = d.get("no_rope_layers")
    if flags is None:
        interval = d["no_rope_layer_interval"]
        if not isinstance(interval, int) or interval < 1:
            raise ModelLoadError(
                f"no_rope_layer_interval must be a positive integer, got {interval!r}"
            )
        return [(index + 1) % interval != 0 for index in range(num_layers)]
    if (
        not isinstance(flags, list)
        or len(flags) < num_layers
        or any(f not in (0, 1) for f in flags)
    ):
        raise ModelLoadError(
            f"no_rope_layers must hold 1 (RoPE) or 0 (NoPE) for each of {num_layers} layers"
        )
    return [bool(flag) for flag in flags[:num_layers]]


def _layer_types(d: dict[str, Any], uses_rope: list[bool], max_positions: int) -> tuple[str, ...]:
    """transformers' layer kinds: declared, else the NoPE layers slide when a window is on."""
    window = d.get("sliding_window")
    is_windowed = bool(d.get("use_sliding_window")) and window is not None
    types = d.get("layer_types")
    if types is None:
        types = [SLIDING if is_windowed and not rotates else FULL for rotates in uses_rope]
    if len(types) != len(uses_rope) or any(t not in (SLIDING, FULL) for t in types):
        raise ModelLoadError(
            f"layer_types must name {SLIDING!r} or {FULL!r} for each of {len(uses_rope)} layers"
        )
    if SLIDING not in types:
        return tuple(types)
    if window is None or not is_windowed:
        raise ModelLoadError("layer_types names sliding layers but use_sliding_window is off")
    if int(window) >= max_positions:
        return (FULL,) * len(types)  # a window over the whole context is no window
    return tuple(types)


def _gguf_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    return {"no_rope_layer_interval": 4}  # llama.cpp's n_no_rope_layer_step, fixed in code


SMOLLM3 = Family(
    ARCHITECTURE,
    "smollm3",
    parse_smollm3,
    LlamaForCausalLM,
    # transformers reads no smollm3 GGUF: its Llama 3 vocabulary converts as llama's.
    gguf=GgufFamily(
        "smollm3", permutes_qk=True, config_entries=_gguf_config, tokenizer_architecture="llama"
    ),
)
FAMILIES = (SMOLLM3,)
