"""GGUF blocks decoded into codes: the values are exactly gguf-py's dequantization."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from sluice.loader.gguf_blocks import FORMATS, decode_blocks
from sluice.models.qblock_pack import pack_codes, packed_bytes, super_block_bytes
from tests.gguf_quants import quantized


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize(("rows", "cols"), [(1, 256), (37, 512), (5, 1024)])
def test_decoded_codes_give_gguf_values_exactly(name, rows, cols):
    raw = quantized(name, rows, cols)
    codes = decode_blocks(raw, name, cols)
    expected = quants.dequantize(raw, getattr(GGMLQuantizationType, name)).reshape(rows, cols)
    assert np.array_equal(codes.dequantize(), expected)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_codes_stay_in_their_ranges(name):
    fmt = FORMATS[name]
    codes = decode_blocks(quantized(name, 8, 512, seed=3), name, 512)
    assert codes.q.max() < (1 << fmt.bits)
    assert (codes.scales is not None) == fmt.has_scales
    assert (codes.m is not None) == fmt.has_min
    assert codes.d.shape == (8, 512 // fmt.super_block)


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="not whole blocks"):
        decode_blocks(quantized("Q4_K", 2, 256), "Q4_K", 128)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_packed_size_is_about_the_files(name):
    fmt = FORMATS[name]
    rows, cols = 40, 512
    raw = quantized(name, rows, cols)
    packed = pack_codes(decode_blocks(raw, name, cols))
    # Three tiles of 16 rows: the last padded with zero codes.
    assert (
        packed.nbytes
        == packed_bytes(fmt, rows, cols)
        == 3 * (cols // fmt.super_block) * (super_block_bytes(fmt))
    )
    file_bits = fmt.block_bytes * 8 / fmt.super_block
    packed_bits = super_block_bytes(fmt) * 8 / (16 * fmt.super_block)
    assert packed_bits <= file_bits + 0.13  # Q4_K: 4.625 against 4.5
