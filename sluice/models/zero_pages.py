"""Zeroed tensors that cost memory only where they are written: the KV pool
and the recurrent-state rows.

The pool is sized for the longest context the model may serve (16 GiB of
bf16 K/V for an 8B file at its 131,072 tokens), most of which no request may
ever reach. `torch.zeros` writes every byte at startup, so all of it is
resident before the first request. On a CPU, `zeros_on_touch` maps anonymous
private memory instead: the kernel hands out a page, zeroed, on its first
write, and every page never written reads as zero without being resident.
The tensor keeps its mapping alive (torch.frombuffer holds a reference to
the mmap), so the memory goes back to the system when the tensor goes.

Invariants: the tensor reads zero everywhere until written, like
torch.zeros; its resident memory is the pages written so far, rounded up to
the transparent huge page (2 MiB) where the kernel gives them
(MADV_HUGEPAGE: fewer TLB misses for attention's reads of a long context).
Other devices allocate as before (torch.zeros): a GPU's allocator commits
what it gives.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch
from torch import Tensor


def zeros_on_touch(shape: tuple[int, ...], dtype: torch.dtype, device) -> Tensor:
    """A zeroed `shape` tensor whose CPU pages become resident on first write."""
    num_bytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or num_bytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    return anonymous_pages(num_bytes).view(dtype).view(shape)


def anonymous_pages(num_bytes: int) -> Tensor:
    """`num_bytes` (> 0) zeroed uint8 of a private anonymous mapping advised
    MADV_HUGEPAGE where the system has the advice: resident page by page as
    written, in 2 MiB pages where the kernel's transparent_hugepage setting
    gives them. The tensor keeps the mapping alive (torch.frombuffer)."""
    # Private: a shared anonymous mapping is shmem, which huge pages skip.
    memory = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel built without huge pages
            memory.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(memory, dtype=torch.uint8)
