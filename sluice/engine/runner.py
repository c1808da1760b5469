"""The model runner: turns a scheduler plan into one forward pass over the
paged KV cache, then samples one token for every request whose prompt is done.

It owns the KV cache tensors (one pool per layer, preallocated) and the
sampler. The scheduler owns the block accounting; the runner only reads the
block tables the plan carries. A hybrid model's conv layers hold their
per-sequence states there instead (sluice/models/sequence_state.py): the
runner names each request's state slot to the model, and after a step that
verified drafts rolls each state back to the last kept position, so that a
rejected draft leaves no trace in it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from sluice.engine.sampled import PromptLogprobsChunk, SampledToken
from sluice.engine.sampler import Sampler, SamplingRow
from sluice.engine.sampling.logprobs import prompt_logprobs
from sluice.engine.scheduler import ScheduledRequest, SchedulerPlan
from sluice.engine.speculation import accepted_tokens
from sluice.models.attention import AttentionMetadata, allocate_kv_caches
from sluice.models.sequence_state import SequenceStates
from sluice.structured.matcher import GrammarMatcher

# Prompt positions whose [V] logits are materialised at once (memory bound).
PROMPT_LOGPROBS_ROWS = 256


@dataclass(slots=True)
class RunnerOutput:
    # One per `samples` entry of the plan, in batch order.
    sampled: list[SampledToken]
    # For the requests that asked for prompt logprobs and computed prompt positions.
    prompt_logprobs: list[PromptLogprobsChunk] = field(default_factory=list)
    # Speculative decoding: per request that verified a draft, the token sampled
    # after each drafted one (`sampled` holds the one before the first).
    draft_samples: dict[str, list[SampledToken]] = field(default_factory=dict)


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        model_config,
        *,
        num_blocks: int,
        block_size_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
        eos_token_ids: frozenset[int],
        num_state_slots: int = 0,
        state_snapshots: bool = True,
        kv_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.block_size_tokens = block_size_tokens
        self.device = device
        # Hybrid models: slots of the per-sequence state (0: no such layer).
        self.has_states = num_state_slots > 0
        # Their snapshot per KV block, for prefix-cache hits (prefix caching on).
        self.state_snapshots = state_snapshots
        # per layer [2, num_blocks, block_size, num_kv_heads, head_dim] (int8
        # KV: head_dim * 5 / 4 bytes, models/kv_int8.py); a conv layer's
        # [num_blocks + num_state_slots, L - 1, hidden] states
        self.kv_caches = allocate_kv_caches(
            model_config, num_blocks, block_size_tokens, dtype, device, max(1, num_state_slots),
            state_snapshots, kv_dtype,
        )  # fmt: skip
        self.sampler = Sampler(model_config.vocab_size, eos_token_ids, device)

    @torch.inference_mode()
    def execute(self, plan: SchedulerPlan) -> RunnerOutput:
        # 1. Flatten the batch: every scheduled request contributes its new tokens.
        scheduled = plan.scheduled
        query_lens = [s.num_new_tokens for s in scheduled]
        context_lens = [s.context_len for s in scheduled]
        input_ids = torch.tensor(
            [t for s in scheduled for t in s.token_ids], dtype=torch.long, device=self.device
        )  # [num_tokens]
        positions = _positions(query_lens, context_lens, self.device)  # [num_tokens]
        attn = AttentionMetadata.build(
            query_lens,
            context_lens,
            [s.block_table for s in scheduled],
            self.block_size_tokens,
            self.device,
        )
        if self.has_states:
            attn.sequence_states = SequenceStates(
                slots=[s.state_slot for s in scheduled],
                starts=[s.starts_state for s in scheduled],
                keeps_inputs=[bool(s.draft_token_ids) for s in scheduled],
                has_snapshots=self.state_snapshots,
            )
        # 2. Run the model over the mixed prefill/decode batch.
        hidden = self.model(input_ids, positions, self.kv_caches, attn)  # [num_tokens, hidden]
        # 3. Prompt logprobs over this step's prompt positions, for those who asked.
        output = RunnerOutput([], self._prompt_logprobs(scheduled, hidden))
        # 4. Logits only where a token is sampled: the last position of each
        #    request that reached the end of its known tokens, and each
        #    position of a draft it verifies.
        sample_rows = [i for i, s in enumerate(scheduled) if s.samples]
        if not sample_rows:
            return output
        if any(scheduled[i].draft_token_ids for i in sample_rows):
            output = self._sample_with_drafts(output, scheduled, sample_rows, hidden)
            if attn.sequence_states is not None:
                _roll_back_states(attn.sequence_states, scheduled, output)
            return output
        ends = torch.tensor(query_lens, device=self.device).cumsum(0) - 1  # [batch]
        last_index = ends[torch.tensor(sample_rows, device=self.device)]  # [num_samples]
        logits = self.model.compute_logits(hidden[last_index])  # [num_samples, vocab]
        rows = [_sampling_row(scheduled[i]) for i in sample_rows]
        output.sampled = self.sampler(logits, rows)
        return output

    def _sample_with_drafts(
        self,
        output: RunnerOutput,
        scheduled: list[ScheduledRequest],
        sample_rows: list[int],
        hidden: torch.Tensor,
    ) -> RunnerOutput:
        """Sample at the last 1 + k positions of a request verifying k drafted
        tokens (row j as if the first j were sampled), at the last of the others."""
        ends = list(itertools.accumulate(s.num_new_tokens for s in scheduled))
        flat_index: list[int] = []
        rows: list[SamplingRow] = []
        for i in sample_rows:
            num_draft = len(scheduled[i].draft_token_ids)
            flat_index.extend(range(ends[i] - 1 - num_draft, ends[i]))
            rows.extend(
                _verification_rows(scheduled[i]) if num_draft else [_sampling_row(scheduled[i])]
            )
        index = torch.tensor(flat_index, device=self.device)  # [num_rows]
        tokens = iter(self.sampler(self.model.compute_logits(hidden[index]), rows))
        for i in sample_rows:
            output.sampled.append(next(tokens))
            if num_draft := len(scheduled[i].draft_token_ids):
                output.draft_samples[scheduled[i].request_id] = [
                    next(tokens) for _ in range(num_draft)
                ]
        return output

    def _prompt_logprobs(
        self, scheduled: list[ScheduledRequest], hidden: torch.Tensor
    ) -> list[PromptLogprobsChunk]:
        """Position p of a prompt predicts prompt token p + 1: a chunk over
        positions [start, end) gives the logprobs of tokens start + 1 .. end
        that are prompt tokens (the last prompt position predicts the first
        output token, which the sampler handles)."""
        chunks, flat_start = [], 0
        for s in scheduled:
            num_prompt = len(s.prompt_token_ids)
            end = min(s.context_len + s.num_new_tokens, num_prompt - 1)
            if s.params.prompt_logprobs is not None and s.context_len < end:
                rows = hidden[flat_start : flat_start + end - s.context_len]  # [m, hidden]
                targets = s.prompt_token_ids[s.context_len + 1 : end + 1]
                chunks.append(
                    PromptLogprobsChunk(
                        s.request_id,
                        s.context_len + 1,
                        self._logprobs_of(rows, targets, s.params.prompt_logprobs),
                    )
                )
            flat_start += s.num_new_tokens
        return chunks

    def _logprobs_of(self, rows: torch.Tensor, targets: list[int], num_top: int):
        """Logprobs of `targets` after hidden `rows` [m, hidden], a slice at a time."""
        target_ids = torch.tensor(targets, dtype=torch.long, device=self.device)  # [m]
        result = None
        for start in range(0, len(targets), PROMPT_LOGPROBS_ROWS):
            stop = start + PROMPT_LOGPROBS_ROWS
            logits = self.model.compute_logits(rows[start:stop])  # [<=256, vocab]
            part = prompt_logprobs(logits, target_ids[start:stop], num_top)
            result = part if result is None else result + part
        return result


def _roll_back_states(
    states: SequenceStates, scheduled: list[ScheduledRequest], output: RunnerOutput
) -> None:
    """Each state after a verification covers the known token and every
    draft; keep it at the known token and the accepted drafts (what the
    scheduler's update keeps: `accepted_tokens`)."""
    first_sampled = iter(output.sampled)
    num_kept: dict[int, int] = {}
    for index, s in enumerate(scheduled):
        if not s.samples:
            continue
        token = next(first_sampled)
        if s.draft_token_ids:
            samples = [token, *output.draft_samples[s.request_id]]
            kept = len(accepted_tokens(s.draft_token_ids, samples))
            if kept < s.num_new_tokens:
                num_kept[index] = kept
    states.roll_back(num_kept)


def _sampling_row(s: ScheduledRequest) -> SamplingRow:
    return SamplingRow(
        request_id=s.request_id,
        params=s.params,
        prompt_token_ids=s.prompt_token_ids,
        output_token_ids=s.output_token_ids,
        grammar=s.grammar,
    )


def _positions(query_lens: list[int], context_lens: list[int], device) -> torch.Tensor:
    """Position of every new token: context_len, context_len + 1, ... per request."""
    if all(q == 1 for q in query_lens):
        return torch.tensor(context_lens, dtype=torch.long, device=device)
    q = torch.tensor(query_lens, dtype=torch.long)
    starts = torch.tensor(context_lens, dtype=torch.long)
    first_flat = q.cumsum(0) - q  # [batch] flat index of each request's first new token
    flat = torch.arange(int(q.sum()))
    # offset within the request = flat index - first flat index of its request
    offsets = flat - first_flat.repeat_interleave(q)
    return (starts.repeat_interleave(q) + offsets).to(device)


def _verification_rows(scheduled: ScheduledRequest) -> list[SamplingRow]:
    """One sampling row per verified position: row j sees the output as if
    the draft's first j tokens had been sampled (and the grammar past them)."""
    draft = scheduled.draft_token_ids
    outputs = list(scheduled.output_token_ids)
    grammar = scheduled.grammar
    rows = []
    for j in range(len(draft) + 1):
        if j > 0 and grammar is not None:
            grammar = _advanced_copy(grammar, draft[j - 1])
        rows.append(
            SamplingRow(
                request_id=scheduled.request_id,
                params=scheduled.params,
                prompt_token_ids=scheduled.prompt_token_ids,
                output_token_ids=outputs + draft[:j] if j else scheduled.output_token_ids,
                grammar=grammar,
            )
        )
    return rows


def _advanced_copy(grammar: GrammarMatcher, token_id: int) -> GrammarMatcher:
    """A copy of the matcher past one more token; the request's own stays put."""
    copy = GrammarMatcher(grammar.matcher.deep_copy(), grammar.request_id)
    copy.accept(token_id)
    return copy
