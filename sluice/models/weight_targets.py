"""Where a checkpoint tensor goes in a model: `WeightTarget`.

A model maps every HF tensor name it expects to one target (a parameter,
or rows of a fused one) and copies each tensor in through it, so a missing,
unexpected or misshapen tensor is one `ModelLoadError`. Every family's model
class builds its map from these (llama.py, gemma3.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from sluice.errors import ModelLoadError


@dataclass(slots=True)
class WeightTarget:
    param: Tensor
    # Rows [row_start, row_end) of `param` hold this tensor; None means all of it.
    row_start: int | None = None
    row_end: int | None = None
    # Added to the values as they are copied in, in float32: Gemma's norms
    # multiply by (1 + weight), which the plain RMSNorm then runs.
    offset: float = 0.0

    def copy_from(self, name: str, tensor: Tensor) -> None:
        dest = self.param if self.row_start is None else self.param[self.row_start : self.row_end]
        if dest.shape != tensor.shape:
            raise ModelLoadError(
                f"tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
            )
        dest.copy_(tensor.float() + self.offset if self.offset else tensor)
