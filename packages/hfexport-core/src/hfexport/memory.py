"""Transparent huge pages for the memory a runtime holds (ONNX Runtime's prepacked weights, XNNPACK's packed
weights in an ExecuTorch program), on Linux: what backends' runners call after their runtime opened a program.

A decode step of a small language model on the CPU reads every weight once from memory (the weights do not stay in
the caches from one step to the next), and at one thread that read is the step's time. ONNX Runtime copies each
``MatMul`` weight into its own packed buffer when the session opens, in ordinary 4 KiB pages: a read of 2 MiB then
crosses 512 pages, each a TLB miss and a stop of the hardware prefetcher's stream. Where the kernel runs transparent
huge pages on request (``/sys/kernel/mm/transparent_hugepage/enabled``: ``madvise``, as here, or ``always``),
``madvise(MADV_COLLAPSE)`` (Linux 6.1) moves such memory into 2 MiB pages in place: same addresses, same bytes.

Measured on this project's 2-core machine (onnxruntime 1.32, one thread, the seeded 58 M-parameter Llama of
``benchmarks/bench_generation.py``, load average ~7): in one interleaved run of the generation benchmark, decode
28.3 / 24.0 tok/s at 32+64 / 512+512 with the session's memory collapsed against 25.6 / 21.8 in 4 KiB pages, ids
equal (``benchmarks/results/bench_generation_toy_onnx.txt``, engine ``onnx-small-pages``). The collapse copies the
memory once: 0.5 to 17 s for ~200 MB on this loaded machine, whose free memory is fragmented; it runs on a
background thread while the first ``generate`` goes on in 4 KiB pages.

Only the 2 MiB units whose every page is resident already are collapsed: the resident memory does not grow (an arena
chunk not yet used stays unpopulated). Anything else (another kernel, a ``never`` setting, an error) leaves the
memory as it was: the values are the same either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Callable, Iterable

__all__ = ["HUGE_PAGE", "anonymous_mappings", "collapse_in_background", "collapse_resident", "huge_pages_possible",
           "new_memory"]

HUGE_PAGE = 2 << 20
_PAGE = 4096
_MADV_COLLAPSE = 25  # include/uapi/asm-generic/mman-common.h, Linux 6.1


def huge_pages_possible() -> bool:
    """Linux, and transparent huge pages not ``never``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as file:
            return "[never]" not in file.read()
    except OSError:
        return False


def anonymous_mappings() -> set[tuple[int, int]]:
    """The process's private, writable, anonymous mappings (``/proc/self/maps``) of at least one huge page:
    ``{(start, end)}``; empty where there is no ``/proc``."""
    ranges = set()
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p":
                continue
            if len(fields) > 5 and fields[5] != "[heap]":  # a file's pages, the stack, vdso...
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start >= HUGE_PAGE:
                ranges.add((start, end))
    return ranges


def new_memory(before: set[tuple[int, int]], after: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The address ranges of ``after`` that no range of ``before`` covers (a mapping that grew, or that the kernel
    merged with a new neighbour, gives only its new part)."""
    old = sorted(before)
    out = []
    for start, end in sorted(after):
        for old_start, old_end in old:
            if old_end <= start or old_start >= end:
                continue
            if old_start > start:
                out.append((start, old_start))
            start = max(start, old_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def collapse_resident(ranges: Iterable[tuple[int, int]]) -> int:
    """``madvise(MADV_COLLAPSE)`` on each 2 MiB-aligned unit within ``ranges`` whose pages are all resident
    (``mincore``); returns the bytes now in huge pages (0 where the kernel cannot). Never raises."""
    if not huge_pages_possible():
        return 0
    try:
        libc = _libc()
    except OSError:
        return 0
    done = 0
    for start, end in ranges:
        first = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        last = end & ~(HUGE_PAGE - 1)
        if last <= first:
            continue
        pages = (last - first) // _PAGE
        resident = (ctypes.c_ubyte * pages)()
        if libc.mincore(first, last - first, resident) != 0:
            continue  # the mapping went away, or the kernel refuses: leave it
        per_unit = HUGE_PAGE // _PAGE
        for unit in range(pages // per_unit):
            if all(resident[unit * per_unit + k] & 1 for k in range(per_unit)) \
                    and libc.madvise(first + unit * HUGE_PAGE, HUGE_PAGE, _MADV_COLLAPSE) == 0:
                done += HUGE_PAGE
    return done


def collapse_in_background(ranges: list[tuple[int, int]], done: Callable[[int], None] | None = None,
                           name: str = "hfexport-huge-pages") -> threading.Thread | None:
    """:func:`collapse_resident` of ``ranges`` on a daemon thread (``madvise`` releases the GIL: the caller's decode
    loop goes on meanwhile, in 4 KiB pages until a unit is collapsed); ``done(bytes)`` when it ends. ``None`` where
    nothing can be collapsed."""
    if not ranges or not huge_pages_possible():
        return None

    def work() -> None:
        collapsed = collapse_resident(ranges)
        if done is not None:
            done(collapsed)

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    return thread
