"""The few-token paths of RoPE and RMSNorm against the plain formulas.

Decode steps (at most FEW_TOKENS rows) take shorter op sequences, and on CPU
RMSNorm runs a C kernel; these tests hold every path to the formulas that long
steps (and transformers) use: float32 to float32 rounding, bfloat16 to one
rounding step of the output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sluice.models.rope_norm import FEW_TOKENS, RMSNorm, RopeAngles

HIDDEN = 576


def plain_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def tables(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.outer(torch.arange(512, dtype=torch.float32), torch.rand(32) * 2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("num_tokens", [1, 3, FEW_TOKENS, FEW_TOKENS + 1, 40])
def test_rope_rotate_equals_the_plain_formula_float32(num_tokens: int) -> None:
    cos_table, sin_table = tables(torch.float32)
    positions = torch.randint(0, 512, (num_tokens,))
    x = torch.randn(num_tokens, 12, 64)
    rope = RopeAngles.at(cos_table, sin_table, positions)
    assert (rope.cos_full is None) == (num_tokens > FEW_TOKENS)
    expected = plain_rope(x, cos_table[positions][:, None], sin_table[positions][:, None])
    torch.testing.assert_close(rope.rotate(x), expected, rtol=1e-6, atol=1e-6)


def test_rope_rotate_bfloat16_no_less_exact_than_the_plain_formula() -> None:
    cos_table, sin_table = tables(torch.bfloat16)
    positions = torch.randint(0, 512, (FEW_TOKENS,))
    x = torch.randn(FEW_TOKENS, 12, 64).bfloat16()
    cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]
    got = RopeAngles.at(cos_table, sin_table, positions).rotate(x).float()
    # The exact rotation of the same bfloat16 inputs, in float32.
    exact = plain_rope(x.float(), cos.float(), sin.float())
    # Each output is a difference of two rounded products: its error is
    # bounded by the size of the products, not of the (maybe cancelled) result.
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.float().abs(), sin.float().abs()
    terms = torch.cat((x1.abs() * c + x2.abs() * s, x2.abs() * c + x1.abs() * s), dim=-1)
    assert ((got - exact).abs() <= terms * 2**-7).all()
    # On average it is closer than the plain bfloat16 formula (fewer roundings).
    plain_error = (plain_rope(x, cos, sin).float() - exact).abs().mean()
    assert (got - exact).abs().mean() <= plain_error


def test_rope_rotate_is_a_rotation() -> None:
    # Norms of each (x1_i, x2_i) pair are kept: the few-op path really rotates.
    cos_table, sin_table = tables(torch.float32)
    x = torch.randn(2, 3, 64)
    out = RopeAngles.at(cos_table, sin_table, torch.tensor([7, 300])).rotate(x)
    pair_norm = lambda t: t[..., :32] ** 2 + t[..., 32:] ** 2  # noqa: E731
    torch.testing.assert_close(pair_norm(out), pair_norm(x), rtol=1e-5, atol=1e-6)


def make_norm(weight: torch.Tensor, path: str) -> RMSNorm:
    """RMSNorm on its C kernel ("native", where a compiler is) or its torch paths."""
    norm = RMSNorm(weight, 1e-5)
    if path == "torch":
        norm._kernel = None
    elif norm._kernel is None:
        pytest.skip("no C compiler here")
    return norm


PATHS = ["native", "torch"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("num_rows", [1, 2, FEW_TOKENS, FEW_TOKENS + 1, 64])
@pytest.mark.parametrize("scale", [1e-3, 0.05, 30.0])
def test_rms_norm_equals_torch_rms_norm_float32(num_rows: int, scale: float, path: str) -> None:
    weight = torch.randn(HIDDEN)
    x = torch.randn(num_rows, HIDDEN) * scale
    got = make_norm(weight, path)(x)
    assert got.shape == (num_rows, HIDDEN) and got.is_contiguous()
    torch.testing.assert_close(got, F.rms_norm(x, (HIDDEN,), weight, 1e-5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
def test_rms_norm_eps_counts_on_tiny_rows(path: str) -> None:
    # A row far below eps: the result is x / sqrt(eps) * w, not x / |x|.
    weight = torch.ones(HIDDEN)
    x = torch.full((1, HIDDEN), 1e-6)
    torch.testing.assert_close(make_norm(weight, path)(x), x / (1e-5 + 1e-12) ** 0.5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("num_rows", [1, FEW_TOKENS, 64])
def test_rms_norm_bfloat16_close_to_exact(path: str, num_rows: int) -> None:
    weight = torch.randn(HIDDEN).bfloat16()
    x = torch.randn(num_rows, HIDDEN).bfloat16()
    got = make_norm(weight, path)(x).float()
    exact = F.rms_norm(x.float(), (HIDDEN,), weight.float(), 1e-5)
    assert ((got - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()
