"""The ONNX runner's huge pages (``hfexport.memory``): a session's new memory found from ``/proc/self/maps``,
collapsed into 2 MiB pages only where every page is resident already, the values unchanged."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from hfexport.memory import (
    HUGE_PAGE,
    anonymous_mappings,
    collapse_in_background,
    collapse_resident,
    huge_pages_possible,
    new_memory,
)


def test_new_memory_gives_only_the_parts_no_earlier_mapping_covers() -> None:
    assert new_memory({(0, 10), (20, 30)}, {(0, 40), (50, 60)}) == [(10, 20), (30, 40), (50, 60)]
    assert new_memory({(5, 10)}, {(0, 10)}) == [(0, 5)]
    assert new_memory({(0, 100)}, {(10, 20)}) == []
    assert new_memory(set(), {(1, 2)}) == [(1, 2)]


def _smaps_kib(start: int, end: int, field: str) -> int:
    """``field`` (``Rss``, ``AnonHugePages``) of the mappings that overlap [start, end) (/proc/self/smaps), in KiB."""
    inside, total = False, 0
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                inside = lo < end and hi > start
            elif inside and fields[0] == field + ":":
                total += int(fields[1])
    return total


@pytest.mark.skipif(not huge_pages_possible(), reason="transparent huge pages: Linux, not 'never'")
def test_collapse_keeps_the_values_and_leaves_pages_not_resident_alone() -> None:
    size = 4 * HUGE_PAGE
    buffer = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    array = np.frombuffer(buffer, dtype=np.uint8)
    start = array.ctypes.data
    assert any(lo <= start and start + size <= hi for lo, hi in anonymous_mappings())
    first = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    offset = first - start
    filled = array[offset:offset + 2 * HUGE_PAGE]  # two units resident, the rest never touched
    filled[:] = np.arange(filled.size, dtype=np.uint64).astype(np.uint8)
    expected = filled.copy()
    collapsed = collapse_resident([(start, start + size + HUGE_PAGE)])
    assert collapsed in (0, HUGE_PAGE, 2 * HUGE_PAGE)  # less: the kernel had no huge page to give then
    np.testing.assert_array_equal(filled, expected)
    if collapsed:
        assert _smaps_kib(start, start + size, "AnonHugePages") >= collapsed // 1024
    untouched = first + 2 * HUGE_PAGE  # the units after the filled ones stayed unpopulated
    resident = (ctypes.c_ubyte * (2 * HUGE_PAGE // 4096))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(untouched, 2 * HUGE_PAGE, resident) == 0
    assert not any(page & 1 for page in resident)
    thread = collapse_in_background([(first, first + 2 * HUGE_PAGE)], done=lambda n: None)
    if thread is not None:
        thread.join(timeout=60)
    np.testing.assert_array_equal(filled, expected)
    del array, filled
    buffer.close()
