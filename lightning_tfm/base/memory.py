"""The C allocator of a training or decoding process: freed memory kept for the next step (glibc).

A training step allocates and frees the same tensors every step, many of them megabytes (a (tokens x d_ff)
activation is 5 MB at the protocol's shapes). glibc's malloc serves a block above its mmap threshold from a fresh
mmap and hands the heap's free top back to the OS past its trim threshold; both thresholds adapt to the sizes
freed, yet at the protocol's step they still let 7,600 pages a step go back to the OS and be faulted in again,
zeroed by the kernel, on the next step (``reports/timing.md``). :func:`keep_freed_memory` fixes both thresholds
(``mallopt``, as ``GLIBC_TUNABLES`` would before the process starts): blocks up to glibc's largest mmap threshold
come from the heap, and its free top is kept up to :data:`TRIM_THRESHOLD`. The numbers a step computes are
untouched: only where its memory comes from changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
#: glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX: 4 * 1024 * 1024 * sizeof(long));
#: blocks above it (the fused loss's kept d/d(logits) buffer) are mmapped as before
MMAP_THRESHOLD = 32 * 2**20
#: the free heap top kept for the next step before glibc returns it: far above a step's freed working set
#: (tens of MB at the protocol's shapes), far below a trial's resident memory (about 1 GB)
TRIM_THRESHOLD = 512 * 2**20

_done: list[bool] = []


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (once; later calls return the first answer).
    True where it took effect; False where the C library is not glibc (macOS, musl), which is left as it is."""
    if not _done:
        _done.append(_set_thresholds())
    return _done[0]


def _set_thresholds() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc's own symbol: musl has mallopt as a stub that does nothing
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
