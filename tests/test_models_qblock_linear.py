"""QBlockLinear's packed bytes: merged parts keep every byte, and large ones sit on huge pages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sluice.models.block_codes import FORMATS
from sluice.models.native.qblock import QBlockMatrix
from sluice.models.qblock_linear import (
    HUGE_PAGES_FROM_BYTES,
    huge_page_bytes,
    merged_parts,
    on_huge_pages,
)

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_huge_pages = pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here"
)


def _mapping_field(address: int, field: str) -> str:
    """A field of /proc/self/smaps for the mapping holding `address`."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            key, *values = line.split()
            if not key.endswith(":"):
                low, high = (int(bound, 16) for bound in key.split("-"))
                inside = low <= address < high
            elif inside and key == field + ":":
                return values[0]
    raise AssertionError(f"no {field} for {address:#x}")


def _matrix(rows: int, cols: int, seed: int) -> QBlockMatrix:
    fmt = FORMATS["Q4_K"]
    size = rows // 16 * cols // fmt.super_block * 2368  # whole 16-row tiles of Q4_K super-blocks
    generator = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)
    return QBlockMatrix(packed, fmt, rows, cols)


@needs_huge_pages
def test_a_large_buffer_is_advised_onto_huge_pages():
    buffer = huge_page_bytes(HUGE_PAGES_FROM_BYTES * 2)
    buffer.fill_(1)
    assert _mapping_field(buffer.data_ptr(), "THPeligible") == "1"


def test_a_small_buffer_keeps_torchs_allocation():
    assert huge_page_bytes(4096).numel() == 4096


@needs_huge_pages
def test_merged_gate_and_up_keep_every_byte_on_huge_pages():
    gate, up = _matrix(2048, 3072, 0), _matrix(2048, 3072, 1)  # 3.5 MiB each
    (merged,) = merged_parts([gate, up])
    assert torch.equal(merged.packed, torch.cat([gate.packed, up.packed]))
    assert (merged.out_features, merged.in_features) == (4096, 3072)
    assert _mapping_field(merged.packed.data_ptr(), "THPeligible") == "1"


@needs_huge_pages
def test_a_matrix_moved_onto_huge_pages_keeps_its_bits():
    matrix = _matrix(4096, 3072, 2)  # 7 MiB
    moved = on_huge_pages(matrix)
    assert torch.equal(moved.packed, matrix.packed)
    assert moved.packed.data_ptr() != matrix.packed.data_ptr()
    assert (moved.format, moved.out_features, moved.in_features) == (
        matrix.format, matrix.out_features, matrix.in_features,
    )  # fmt: skip
    assert _mapping_field(moved.packed.data_ptr(), "THPeligible") == "1"
