"""Host memory reuse for CPU scoring.

glibc gives a large freed block back to the kernel at once and page-faults a fresh one in on the
next allocation. Merging an adapter on a CPU allocates an fp32 delta of tens of MB per
projection and frees it right after, so with glibc's defaults the merge spent more time in page
faults than in arithmetic: 7 s against 1.8 s per assignment for Qwen2.5-1.5B with every
projection adapted (bench/RESULTS.md, "lora model work"). Kept in the process instead, freed
blocks are reused; the process holds on to its peak memory, which a validator keeping a base
loaded does anyway. Allocation only: no number changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# The largest value both take: blocks up to 2 GiB come from the heap and stay there.
KEEP_BYTES = 2**31 - 1


def keep_freed_memory() -> bool:
    """Tells glibc to keep freed blocks for reuse; False where that is not possible (another C
    library), and nothing changes then."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    kept = bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)
    )
    if not kept:
        log.info("this C library does not take mallopt; freed memory is returned as usual")
    return kept
