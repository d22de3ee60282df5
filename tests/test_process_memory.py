"""`icemaint serve` hands the C heap's freed pages back after each tick (`trim_heap`): a fragmented heap, made here
with glibc's own malloc, shrinks in resident memory only through the trim."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import pytest

from icemaint.app.process_memory import _malloc_trim, rss_bytes, trim_heap

MiB = 2**20
BLOCK = 64 * 1024 - 64  # under malloc's mmap threshold: chunks of the heap itself, as a tick's many small frees are


@pytest.mark.skipif(_malloc_trim() is None, reason="not glibc: there is no malloc_trim to call")
def test_the_trim_gives_back_the_pages_a_pinned_heap_keeps_after_free():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 128 MiB in blocks carved one after the other, every page touched so it is resident; every other one is
    # freed: each freed block lies between two live ones, so free() alone can give none of its pages back.
    blocks = []
    for _ in range(2048):
        blocks.append(libc.malloc(BLOCK))
        ctypes.memset(blocks[-1], 1, BLOCK)
    try:
        for block in blocks[::2]:
            libc.free(block)
        held = rss_bytes(os.getpid())
        released = trim_heap()
        after = rss_bytes(os.getpid())
    finally:
        for block in blocks[1::2]:
            libc.free(block)
    assert held is not None and after is not None and released is not None
    assert released >= 32 * MiB, f"the trim released {released / MiB:.1f} MiB of 64 MiB freed"
    assert after <= held - 32 * MiB


def test_a_process_that_is_gone_has_no_resident_set():
    assert rss_bytes(2**22 + 12345) is None  # above Linux's pid_max default: no such process
