"""A mixture-of-experts MLP: `MoeBlock` (a router, top-k routing, the experts).

Each token's router logits (float32) choose its k experts and their weights;
each family's normalisation is one `router_scoring` value:
- "softmax_topk": softmax over all experts, then the k largest, scaled to sum
  to one where `norm_topk_prob` (Qwen3-MoE) and left as they are where not
  (OLMoE);
- "topk_softmax": the k largest logits, then a softmax over those k (gpt-oss).

A shared expert (Qwen2-MoE), where a family has one, runs on every token and
adds sigmoid(x . w) times its output, after the routed experts.

The experts run as one grouped computation: the (token, rank) assignments are
sorted by expert, each chosen expert multiplies the rows routed to it in one
pass, and the outputs go back to their (token, rank) places. Only the chosen
experts' weights are read: a decode step of one token reads k experts.

Row invariance (a token's output depends only on its own values and routing,
never on how many tokens shared the step or which experts the others chose):
- every matmul, the router's and each expert's, runs on tiles of exactly
  `BATCH_INVARIANT_ROW_TILE` rows (`linear.in_row_tiles`), so the kernel and
  its blocking never change with the number of rows an expert got; the
  softmaxes (exp, whose vectorised and scalar loops may round differently)
  run on the same tiles;
- a token's k expert outputs are summed in the order of its own ranks, in
  float32, by elementwise multiplies and adds (each rounded alone, whatever
  the vector width), and rounded to the model dtype once.

The expert weights are stacked, one tensor per projection, in the model
dtype: `gate_up` [E, 2 I, H] (rows: gate, then up) and `down` [E, H, I].
Weight-only int8/int4 (`--quantization`) and the int8 activation scheme
apply to the attention matrices; the experts keep the model dtype, unless
they stay quantized as the file has them: `keep_experts` swaps the stacks
for a module that runs each expert from its own 4-bit weights
(moe_blocks.py: a GGUF's blocks; mxfp4_experts.py: gpt-oss's MXFP4), one
call per projection over all the rows routed to the expert, or, where the
module has it (`KeptExperts.weighted_sum`: GGUF blocks with SwiGLU, MXFP4
with gpt-oss's clamped SwiGLU), one native call for every chosen expert of
every row and their weighted sum.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import DecoderConfig
from sluice.models.linear import BATCH_INVARIANT_ROW_TILE, in_row_tiles, uninitialised_weight

SOFTMAX_TOPK, TOPK_SOFTMAX = "softmax_topk", "topk_softmax"
ROUTER_SCORINGS = (SOFTMAX_TOPK, TOPK_SOFTMAX)
_TILE = BATCH_INVARIANT_ROW_TILE


def check_experts(config: DecoderConfig) -> None:
    """ModelLoadError (one line) on an expert count or routing the layer does not run."""
    if config.num_experts <= 0:
        raise ModelLoadError(f"num_experts must be positive, got {config.num_experts}")
    if not 1 <= config.num_experts_per_tok <= config.num_experts:
        raise ModelLoadError(
            f"num_experts_per_tok {config.num_experts_per_tok} must be between 1 and "
            f"num_experts {config.num_experts}"
        )
    if config.moe_intermediate_size <= 0:
        raise ModelLoadError(
            f"moe_intermediate_size must be positive, got {config.moe_intermediate_size}"
        )
    if config.shared_expert_intermediate_size < 0:
        raise ModelLoadError(
            "shared_expert_intermediate_size must not be negative, got "
            f"{config.shared_expert_intermediate_size}"
        )
    if config.router_scoring not in ROUTER_SCORINGS:
        raise ModelLoadError(
            f"unsupported expert routing {config.router_scoring!r}; "
            f"supported: {', '.join(ROUTER_SCORINGS)}"
        )


class MoeBlock(nn.Module):
    """The router and the experts of one layer (module docstring)."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, device) -> None:
        super().__init__()
        check_experts(config)
        experts, hidden = config.num_experts, config.hidden_size
        width = config.moe_intermediate_size
        self.num_experts = experts
        self.top_k = config.num_experts_per_tok
        self.scoring = config.router_scoring
        self.norm_topk_prob = config.norm_topk_prob
        # Router logits in float32, from float32 weights: near ties between
        # experts are not decided by the model dtype's rounding.
        self.router = uninitialised_weight(experts, hidden, dtype=torch.float32, device=device)
        # [E, 2 I, H]: each expert's gate rows, then its up rows.
        self.gate_up = uninitialised_weight(experts, 2 * width, hidden, dtype=dtype, device=device)
        self.down = uninitialised_weight(experts, hidden, width, dtype=dtype, device=device)
        # Qwen2-MoE's shared expert; None: none.
        self.shared: SharedExpert | None = None
        if width := config.shared_expert_intermediate_size:
            self.shared = SharedExpert(hidden, width, dtype, device)
        # The experts in their file's quantization (`keep_experts`); None: the stacks.
        self.kept: KeptExperts | None = None

    def keep_experts(self, kept: KeptExperts) -> None:
        """Run the experts from `kept` from now on and drop the float stacks."""
        self.kept = kept
        empty = torch.empty(0, dtype=self.gate_up.dtype, device=self.gate_up.device)
        self.gate_up = nn.Parameter(empty, requires_grad=False)
        self.down = nn.Parameter(empty.clone(), requires_grad=False)

    def forward(self, x: Tensor, swiglu: Callable[[Tensor], Tensor]) -> Tensor:  # [T, H] -> [T, H]
        expert_ids, weights = self.route(x)  # [T, k] each
        total = None  # [T, H] float32
        if self.kept is not None:  # every chosen expert in one native call, where it has one
            total = self.kept.weighted_sum(x, expert_ids, weights, swiglu)
        if total is None:
            outputs = self.expert_outputs(x, expert_ids, swiglu)  # [T, k, H]
            total = outputs[:, 0].float().mul_(weights[:, :1])
            for rank in range(1, self.top_k):  # in rank order: the same sum in any step
                total.add_(outputs[:, rank].float().mul_(weights[:, rank : rank + 1]))
        if self.shared is not None:
            total.add_(in_row_tiles(functools.partial(self.shared, swiglu), x, _TILE))
        return total.to(x.dtype)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Each token's experts, best first, and their weights: ([T, k] int64, [T, k] float32)."""
        scores = in_row_tiles(self._scores, x, _TILE)  # [T, E] float32
        top, expert_ids = scores.topk(self.top_k, dim=-1)  # [T, k] each, best first
        if self.scoring == TOPK_SOFTMAX:
            top = in_row_tiles(functools.partial(torch.softmax, dim=-1), top, _TILE)
        elif self.norm_topk_prob:
            total = top[:, :1].clone()  # [T, 1], summed in rank order
            for rank in range(1, self.top_k):
                total.add_(top[:, rank : rank + 1])
            top = top / total
        return expert_ids, top

    def _scores(self, x: Tensor) -> Tensor:  # [tile, H] -> [tile, E] float32
        logits = F.linear(x.float(), self.router)
        return logits.softmax(dim=-1) if self.scoring == SOFTMAX_TOPK else logits

    def expert_outputs(
        self, x: Tensor, expert_ids: Tensor, swiglu: Callable[[Tensor], Tensor]
    ) -> Tensor:  # [T, H], [T, k] -> [T, k, H]: token t's rank-r expert's output
        num_tokens, hidden = x.shape
        flat = expert_ids.flatten()  # [T k]: assignment t * k + r
        order = flat.argsort(stable=True)  # assignments grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        rows = x.index_select(0, order // self.top_k)  # [T k, H], grouped by expert
        grouped = torch.empty_like(rows)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                grouped[start : start + count] = self._expert_rows(
                    expert, swiglu, rows[start : start + count]
                )
                start += count
        outputs = torch.empty_like(grouped)
        outputs[order] = grouped  # back to (token, rank) order
        return outputs.view(num_tokens, self.top_k, hidden)

    def _expert_rows(
        self, expert: int, swiglu: Callable[[Tensor], Tensor], x: Tensor
    ) -> Tensor:  # [n, H]: every row routed to `expert` -> [n, H]
        if self.kept is not None:
            return self.kept(expert, swiglu, x)
        return in_row_tiles(functools.partial(self._expert, expert, swiglu), x, _TILE)

    def _expert(
        self, expert: int, swiglu: Callable[[Tensor], Tensor], x: Tensor
    ) -> Tensor:  # [tile, H] -> [tile, H]
        gate_up = F.linear(x, self.gate_up[expert])  # [tile, 2 I]
        return F.linear(swiglu(gate_up), self.down[expert])  # [tile, I] -> [tile, H]

    def expert_bytes(self) -> int:
        kept = 0 if self.kept is None else self.kept.nbytes()
        return kept + self.gate_up.nbytes + self.down.nbytes

    def expert_format(self) -> str:
        """How the experts' weights are held: 'bfloat16', 'GGUF blocks (Q4_K, Q6_K)'."""
        if self.kept is not None:
            return self.kept.describe()
        return str(self.gate_up.dtype).removeprefix("torch.")


class KeptExperts(nn.Module):
    """The experts of a layer in their file's quantization (a subclass per scheme)."""

    def forward(
        self, expert: int, swiglu: Callable[[Tensor], Tensor], x: Tensor
    ) -> Tensor:  # [n, H]: the rows routed to `expert` -> [n, H]
        raise NotImplementedError

    def weighted_sum(
        self, x: Tensor, expert_ids: Tensor, weights: Tensor, swiglu: Callable[[Tensor], Tensor]
    ) -> Tensor | None:  # [T, H], [T, k], [T, k] -> [T, H] float32
        """MoeBlock.forward's weighted sum of the chosen experts, the same bits,
        in one call; None where the scheme has no such call (then one call a
        projection a chosen expert, `forward`)."""
        return None

    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.buffers())

    def describe(self) -> str:
        raise NotImplementedError


class SharedExpert(nn.Module):
    """An expert every token runs, scaled by sigmoid(x . w) (Qwen2-MoE)."""

    def __init__(self, hidden: int, width: int, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.gate_up = uninitialised_weight(2 * width, hidden, dtype=dtype, device=device)
        self.down = uninitialised_weight(hidden, width, dtype=dtype, device=device)
        # [1, H] float32, as the router.
        self.gate = uninitialised_weight(1, hidden, dtype=torch.float32, device=device)

    def forward(
        self, swiglu: Callable[[Tensor], Tensor], x: Tensor
    ) -> Tensor:  # [tile, H] -> [tile, H] float32
        gate = torch.sigmoid(F.linear(x.float(), self.gate))  # [tile, 1]
        out = F.linear(swiglu(F.linear(x, self.gate_up)), self.down)  # [tile, H]
        return out.float().mul_(gate)
