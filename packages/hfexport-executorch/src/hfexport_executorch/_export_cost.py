"""Pipeline code that cuts what an ExecuTorch export costs: torch's preservable CIA ops collected once per export
(:func:`cia_ops_collected_once`), which ``ExecutorchExporter.prepare`` holds for the whole export. It changes no
program and is not a registered workaround (``disable=`` does not name it).

The registered patches that replace costly ExecuTorch steps upstream could fix are workarounds:
``_patch_partition_without_regenerating_the_graph`` (``workarounds/executorch_patches.py``) and
``_patch_preprocess_copy_shares_weights`` (``workarounds/xnnpack_patches.py``). All are tested in
``tests/executorch/test_executorch_export_cost.py``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["cia_ops_collected_once"]

_CIA_OPS_CALLERS = ("torch.export.exported_program", "torch.export.decomp_utils")  # the names its callers call
_cia_lock = threading.Lock()
_cia_installed: list[tuple[Any, Any]] = []  # (module, original) while at least one export holds the cache
_cia_holders = 0


def _collected_once(original: Any) -> Any:
    """``original`` (torch's ``_collect_all_valid_cia_ops``) answered from a cache while the number of C++
    CompositeImplicitAutograd registrations, the only thing its answer depends on, stays the same."""
    cache: dict[int, frozenset[Any]] = {}

    @functools.wraps(original)
    def _collect_all_valid_cia_ops() -> set[Any]:
        key = len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
        if key not in cache:
            cache.clear()
            cache[key] = frozenset(original())
        return set(cache[key])  # each caller its own copy

    return _collect_all_valid_cia_ops


@contextlib.contextmanager
def cia_ops_collected_once() -> Iterator[None]:
    """While the ``with`` body runs, torch collects its preservable CompositeImplicitAutograd ops once, not on every
    ``run_decompositions`` and decomposition table.

    ``_collect_all_valid_cia_ops`` walks every op of every namespace (``torch.ops.aten``: 500 CIA ops among some
    2,600 overloads) on each call, and an ExecuTorch lowering calls it 17 times: 1.8 s of a 31 s toy export, about a
    third of a tiny model's. The exporter holds the cache for the whole export (``prepare``); nested and concurrent
    exports share it, and the last one out puts torch's function back.
    """
    import importlib

    global _cia_holders
    with _cia_lock:
        if _cia_holders == 0:
            modules = [importlib.import_module(name) for name in _CIA_OPS_CALLERS]
            originals = {id(m._collect_all_valid_cia_ops): m._collect_all_valid_cia_ops for m in modules}
            cached = {key: _collected_once(fn) for key, fn in originals.items()}  # one cache per function
            for module in modules:
                original = module._collect_all_valid_cia_ops
                _cia_installed.append((module, original))
                module._collect_all_valid_cia_ops = cached[id(original)]
        _cia_holders += 1
    try:
        yield
    finally:
        with _cia_lock:
            _cia_holders -= 1
            if _cia_holders == 0:
                while _cia_installed:
                    module, original = _cia_installed.pop()
                    module._collect_all_valid_cia_ops = original
