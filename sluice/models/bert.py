"""A BERT encoder (sentence-transformers' encoders, cross-encoders): bidirectional
attention over whole sequences, no KV cache.

`BertEncoder(config)` holds the weights under their Hugging Face names
(`embeddings.*`, `encoder.layer.N.*`, `pooler.dense`, `classifier`; only
`attention.self` is `attention.self_attention` here), so a checkpoint loads
by name (`load_weights`, which also takes the `bert.` prefix of a
`BertForSequenceClassification`). `forward` takes a flat batch
and returns the last hidden states; `classify` is a sequence classifier's
head over the [CLS] state (pooler, then classifier), as transformers' is.

Numerics follow transformers' `BertModel` in eval mode: post-LayerNorm layers,
exact (erf) GELU, absolute positions from 0. A step's sequences run flat
(`EncoderBatch`): the dense layers and norms see exactly their tokens, no
padding; attention pads them to the longest and masks the padding out of
the keys, so a sequence's states do not depend on the rest of its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sluice.errors import ModelLoadError

BERT_ARCHITECTURES = ("BertModel", "BertForSequenceClassification")
# The architectures with a classification head (cross-encoders: score, not embed).
_CLASSIFIERS = frozenset({"BertForSequenceClassification"})
_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"gelu": F.gelu, "relu": F.relu}


@dataclass(frozen=True, slots=True)
class BertConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    # Outputs of a sequence classifier's head (a cross-encoder: 1); 0: none.
    num_labels: int

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> BertConfig:
        """config.json of a BERT model; ModelLoadError naming what it cannot run."""
        architecture = (d.get("architectures") or ["BertModel"])[0]
        if architecture not in BERT_ARCHITECTURES:
            raise ModelLoadError(f"unsupported encoder architecture {architecture!r}")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ModelLoadError("only absolute position embeddings are supported in BERT models")
        if d.get("hidden_act", "gelu") not in _ACTIVATIONS:
            raise ModelLoadError(f"unsupported BERT activation {d.get('hidden_act')!r}")
        num_labels = 0
        if architecture in _CLASSIFIERS:
            num_labels = len(d.get("id2label") or {}) or int(d.get("num_labels", 2))
        try:
            return cls(
                architecture=architecture,
                vocab_size=int(d["vocab_size"]),
                hidden_size=int(d["hidden_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=int(d["num_attention_heads"]),
                intermediate_size=int(d["intermediate_size"]),
                hidden_act=d.get("hidden_act", "gelu"),
                max_position_embeddings=int(d.get("max_position_embeddings", 512)),
                type_vocab_size=int(d.get("type_vocab_size", 2)),
                layer_norm_eps=float(d.get("layer_norm_eps", 1e-12)),
                num_labels=num_labels,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"config.json lacks a BERT field: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class EncoderBatch:
    """One step's sequences, flat: sequence b's tokens are rows [start_b,
    start_b + len_b). The dense layers run on exactly these rows; attention
    alone scatters them into a padded [B, L] layout, padding masked out."""

    input_ids: Tensor  # [T] int64
    token_type_ids: Tensor  # [T] int64
    positions: Tensor  # [T] int64, from 0 in each sequence
    # Each token's row in the padded layout: b * L + its position.
    padded_index: Tensor  # [T] int64
    key_mask: Tensor  # [B, 1, 1, L] bool: False on padding
    # Each sequence's first row (its [CLS] token).
    starts: Tensor  # [B] int64

    @classmethod
    def build(
        cls, sequences: list[list[int]], token_types: list[list[int] | None], device
    ) -> EncoderBatch:
        lengths = torch.tensor([len(ids) for ids in sequences])  # [B]
        batch, length = len(sequences), int(lengths.max())
        owner = torch.repeat_interleave(torch.arange(batch), lengths)  # [T]
        starts = lengths.cumsum(0) - lengths  # [B]
        positions = torch.arange(int(lengths.sum())) - starts[owner]  # [T]
        types = [
            [0] * len(ids) if t is None else t
            for ids, t in zip(sequences, token_types, strict=True)
        ]
        is_token = torch.arange(length)[None, :] < lengths[:, None]  # [B, L]
        return cls(
            input_ids=torch.tensor([t for ids in sequences for t in ids]).to(device),
            token_type_ids=torch.tensor([t for row in types for t in row]).to(device),
            positions=positions.to(device),
            padded_index=(owner * length + positions).to(device),
            key_mask=is_token[:, None, None, :].to(device),
            starts=starts.to(device),
        )

    @property
    def num_seqs(self) -> int:
        return self.key_mask.shape[0]

    @property
    def max_len(self) -> int:
        return self.key_mask.shape[-1]


class _Embeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h)
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def forward(self, batch: EncoderBatch) -> Tensor:  # -> [T, H]
        x = self.word_embeddings(batch.input_ids) + self.token_type_embeddings(batch.token_type_ids)
        return self.LayerNorm(x + self.position_embeddings(batch.positions))


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)


class _DenseNorm(nn.Module):
    """A projection, then the residual's LayerNorm (BERT's `*.output`)."""

    def __init__(self, num_in: int, hidden: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(num_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(residual + self.dense(x))


class _Attention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        h = config.hidden_size
        # HF's `attention.self` (a name Python reserves by convention): mapped in load_weights.
        self.self_attention = _SelfAttention(h)
        self.output = _DenseNorm(h, h, config.layer_norm_eps)


class _Dense(nn.Module):
    def __init__(self, num_in: int, num_out: int):
        super().__init__()
        self.dense = nn.Linear(num_in, num_out)


class _Layer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.attention = _Attention(config)
        self.intermediate = _Dense(h, config.intermediate_size)
        self.output = _DenseNorm(config.intermediate_size, h, eps)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: Tensor, batch: EncoderBatch) -> Tensor:  # [T, H] -> [T, H]
        x = self.attention.output(self._attend(x, batch), x)  # [T, H]
        inner = self.act(self.intermediate.dense(x))  # [T, I]
        return self.output(inner, x)

    def _attend(self, x: Tensor, batch: EncoderBatch) -> Tensor:  # [T, H] -> [T, H]
        projections = self.attention.self_attention
        num_rows, hidden = batch.num_seqs * batch.max_len, x.shape[1]

        def heads(linear: nn.Linear) -> Tensor:  # [T, H] -> [B, heads, L, H / heads]
            padded = x.new_zeros(num_rows, hidden).index_copy_(0, batch.padded_index, linear(x))
            view = padded.view(batch.num_seqs, batch.max_len, self.num_heads, -1)
            return view.transpose(1, 2)

        q, k, v = heads(projections.query), heads(projections.key), heads(projections.value)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.key_mask)  # [B, heads, L, D]
        return out.transpose(1, 2).reshape(num_rows, hidden)[batch.padded_index]  # [T, H]


class _Encoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig, dtype: torch.dtype = torch.float32, device="cpu"):
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)
        self.pooler: _Dense | None = None
        self.classifier: nn.Linear | None = None
        if config.num_labels:
            self.pooler = _Dense(config.hidden_size, config.hidden_size)
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.to(dtype=dtype, device=device)
        self.dtype = dtype

    def forward(self, batch: EncoderBatch) -> Tensor:  # [T, H] last hidden states
        x = self.embeddings(batch)
        for layer in self.encoder.layer:
            x = layer(x, batch)
        return x

    def classify(self, hidden: Tensor, batch: EncoderBatch) -> Tensor:  # -> [B, labels] float32
        assert self.pooler is not None and self.classifier is not None, "no classifier head"
        pooled = torch.tanh(self.pooler.dense(hidden[batch.starts]))  # [B, H]: the [CLS] states
        return self.classifier(pooled).float()

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Every parameter from a checkpoint's tensors; ModelLoadError naming a missing one."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("bert.").replace(
                ".attention.self.", ".attention.self_attention."
            )
            if name not in params:
                continue  # position_ids buffers, an unused pooler, MLM heads
            target = params[name]
            if target.shape != tensor.shape:
                raise ModelLoadError(
                    f"tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            with torch.no_grad():
                target.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ModelLoadError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[0]}")
