"""The hybrids' recurrences on the native kernels (native/gated_delta.c and
native/mamba_scan.c through native/recurrent.py): within float32 rounding of
the torch recurrences (the layers' fallback, transformers' formulas), and a
sequence's outputs and states bit for bit the same whether its tokens come
in one call or many, alone or beside other sequences; the states after m
tokens saved where the saves name; rows out of range refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sluice.models import mamba2_scan
from sluice.models.native.recurrent import (
    Kept,
    RecurrentRows,
    gated_delta_rule,
    mamba_scan,
    recurrent_available,
)

pytestmark = pytest.mark.skipif(not recurrent_available(), reason="needs the native library")

HK, HV, DK, DV = 2, 4, 24, 20  # odd widths: off every 16-lane vector
CONV = 2 * HK * DK + HV * DV
EPS = 1e-6


def gdn_inputs(num_tokens: int, seed: int = 0) -> tuple[tuple, tuple]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    inputs = (r(num_tokens, CONV), r(num_tokens, HV * DV), r(num_tokens, HV), r(num_tokens, HV))
    weights = (-r(HV).exp(), r(HV), 1 + 0.1 * r(DV))
    return inputs, weights


def gdn_reference(inputs: tuple, weights: tuple, state: torch.Tensor) -> torch.Tensor:
    """transformers' torch_recurrent_gated_delta_rule and gated RMSNorm, float32."""
    conv, z, b, a = inputs
    neg_a, dt_bias, norm = weights
    outs = []
    for t in range(conv.shape[0]):
        q, k, v = F.silu(conv[t]).split([HK * DK, HK * DK, HV * DV])
        q, k = (x.view(HK, DK).repeat_interleave(HV // HK, 0) for x in (q, k))
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / DK**0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        g = neg_a * F.softplus(a[t] + dt_bias)
        state.mul_(g.exp()[:, None, None])
        delta = (v.view(HV, DV) - (state * k[:, :, None]).sum(1)) * b[t].sigmoid()[:, None]
        state.add_(k[:, :, None] * delta[:, None, :])
        o = (state * q[:, :, None]).sum(1)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS) * norm
        outs.append((o * F.silu(z[t].view(HV, DV))).reshape(-1))
    return torch.stack(outs)


def run_gdn(inputs, weights, rows, cache, kept=None, bf16=False) -> torch.Tensor:
    return gated_delta_rule(tuple(inputs), weights, rows, cache, kept, (HK, HV, DK, DV), EPS, bf16)


def one_sequence(first: int, count: int, source: int | None, slot: int) -> RecurrentRows:
    return RecurrentRows([(first, count, source)], [(0, count, slot)])


def test_the_gated_delta_rule_is_transformers_recurrence_within_float32_rounding():
    inputs, weights = gdn_inputs(9)
    cache = torch.zeros(2, HV * DK * DV + 3)
    out = run_gdn(inputs, weights, one_sequence(0, 9, None, 1), cache[:, 3:])
    state = torch.zeros(HV, DK, DV)
    expected = gdn_reference(inputs, weights, state)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache[1, 3:].view(HV, DK, DV), state, rtol=1e-5, atol=1e-5)


def test_a_sequence_has_the_same_bits_in_one_call_in_chunks_and_beside_another():
    inputs, weights = gdn_inputs(11)
    whole_cache = torch.zeros(3, HV * DK * DV)
    whole = run_gdn(inputs, weights, one_sequence(0, 11, None, 0), whole_cache)
    chunked_cache, outs, done = torch.zeros(3, HV * DK * DV), [], 0
    for size in (4, 1, 6):
        part = tuple(x[done : done + size] for x in inputs)
        outs.append(run_gdn(part, weights, one_sequence(0, size, done and 2, 2), chunked_cache))
        done += size
    assert torch.equal(torch.cat(outs), whole) and torch.equal(chunked_cache[2], whole_cache[0])
    other, _ = gdn_inputs(5, seed=1)
    both = tuple(torch.cat([o, x]) for o, x in zip(other, inputs, strict=True))
    rows = RecurrentRows([(0, 5, None), (5, 11, None)], [(1, 11, 1), (0, 5, 0)])
    beside = run_gdn(both, weights, rows, torch.zeros(3, HV * DK * DV))
    assert torch.equal(beside[5:], whole)


def test_the_saves_hold_the_state_after_m_tokens_in_the_cache_and_kept_rows():
    inputs, weights = gdn_inputs(6)
    numel = HV * DK * DV
    cache, kept = torch.zeros(4, numel), torch.full((7, numel), float("nan"))
    saves = [(0, 6, 0), (0, 4, 3)] + [(0, m, Kept(m)) for m in range(7)]
    run_gdn(inputs, weights, RecurrentRows([(0, 6, None)], saves), cache, kept)
    step_cache = torch.zeros(2, numel)
    for m in range(6):
        assert torch.equal(kept[m], step_cache[1])
        part = tuple(x[m : m + 1] for x in inputs)
        run_gdn(part, weights, one_sequence(0, 1, m and 1, 1), step_cache)
    assert torch.equal(kept[6], step_cache[1]) and torch.equal(cache[0], kept[6])
    assert torch.equal(cache[3], kept[4])


def test_bfloat16_rounds_where_the_model_dtype_rounds():
    inputs, weights = gdn_inputs(3)
    out = run_gdn(inputs, weights, one_sequence(0, 3, None, 0), torch.zeros(1, HV * DK * DV),
                  bf16=True)  # fmt: skip
    assert torch.equal(out, out.bfloat16().float())
    reference = gdn_reference(inputs, weights, torch.zeros(HV, DK, DV))
    torch.testing.assert_close(out, reference, rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    "rows",
    [
        one_sequence(0, 2, 5, 0),  # a source row past the cache
        one_sequence(0, 2, None, 2),  # a save past the cache
        RecurrentRows([(0, 2, None)], [(0, 1, Kept(0))]),  # a kept row with no kept buffer
        RecurrentRows([(0, 2, None)], [(0, 3, 0)]),  # a save after more tokens than it has
    ],
)
def test_rows_out_of_range_are_refused(rows):
    inputs, weights = gdn_inputs(2)
    with pytest.raises(AssertionError, match="refused"):
        run_gdn(inputs, weights, rows, torch.zeros(2, HV * DK * DV))


H, P, G, N = 4, 6, 2, 19


def scan_inputs(num_tokens: int, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    dt = F.softplus(r(num_tokens, H))
    return (
        r(num_tokens, H, P),
        dt,
        (-dt * r(H).exp()).exp(),
        r(num_tokens, G, N),
        r(num_tokens, G, N),
    )


def test_the_mamba_scan_is_the_torch_scan_within_float32_rounding():
    x, dt, decay, b_in, c_out = scan_inputs(7)
    cache = torch.zeros(2, H * P * N)
    y = mamba_scan(x, dt, decay, b_in, c_out, one_sequence(0, 7, None, 1), cache, None)
    plan = mamba2_scan.MambaPlan([0], [True], [0], [7], [[(7, 1)]])
    per_head = lambda t: t.repeat_interleave(H // G, dim=1)  # noqa: E731
    expected, states = mamba2_scan.scan(x, dt, decay, per_head(b_in), per_head(c_out),
                                        torch.zeros(1, H, P, N), plan)  # fmt: skip
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache[1].view(H, P, N), states[(0, 7)], rtol=1e-5, atol=1e-5)


def test_a_scanned_sequence_has_the_same_bits_in_one_call_and_in_chunks():
    inputs = scan_inputs(9)
    whole_cache = torch.zeros(2, H * P * N)
    whole = mamba_scan(*inputs, one_sequence(0, 9, None, 0), whole_cache, None)
    cache, outs = torch.zeros(2, H * P * N), []
    for start, size in ((0, 2), (2, 7)):
        part = [t[start : start + size] for t in inputs]
        outs.append(mamba_scan(*part, one_sequence(0, size, start and 1, 1), cache, None))
    assert torch.equal(torch.cat(outs), whole) and torch.equal(cache[1], whole_cache[0])
