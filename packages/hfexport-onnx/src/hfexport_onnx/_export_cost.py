"""Workarounds that cut what every ONNX export pays before its graph is translated (stage 4's ``torch.onnx.export``).

They change no graph: the same translations are looked up in the same registry. Each is a registered patch of the
``"onnx"`` scope (installed in stage 1, active to the end of the export; ``disable=("<name>",)`` leaves it out)
with a test in ``tests/onnx/test_onnx_optimizer_cost.py``.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from hfexport.plugin import register_patch

__all__: list[str] = []

_BUILT: dict[tuple[Any, ...], Any] = {}  # (class, arguments, what the registry is built from) -> the built registry


def _sources_key() -> tuple[int, int, int]:
    """What ``ONNXRegistry.from_torchlib`` reads: torch's own torchlib functions, onnxscript's torchlib registry,
    and the torch ops its names resolve to (a registry built before an op or a function was registered differs)."""
    import torch
    from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 - ops registers the functions
    from torch.onnx._internal.exporter._torchlib import _torchlib_registry

    _torchlib_registry.get_torchlib_ops()  # imports (registers) torch's own torchlib ops
    onnxscript_functions = sum(len(f.overloads) + len(f.complex) for f in registration.default_registry.values())
    return (len(_torchlib_registry._registry), onnxscript_functions, len(torch._C._dispatch_get_all_op_names()))


@register_patch("onnx", "torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib")
def _patch_torchlib_registry_built_once(original: Any) -> Any:
    """Builds torch.onnx's registry of torchlib translations once per process and hands each export its own copy.

    **Why**: ``torch.onnx.export`` builds ``ONNXRegistry.from_torchlib()`` on every call: for each of onnxscript's
    ~500 torchlib functions it rebuilds the function's IR from its Python source (``OnnxFunction.function_ir``:
    ``inspect.getsource``, tokenize, parse) and infers its signature. That is 0.3-0.5 s of CPU per export, about
    40% of a tiny module's warm export (cProfile: ``from_torchlib`` 3.4 of 5.6 s of a profiled 2-linear export).
    The registry depends only on the installed torchlib functions and torch ops, so the replacement keeps the first
    one built while their counts stay the same, and returns a copy whose lists of translations are its own: the
    export's ``custom_translation_table`` (hfexport's ``onnx_translation`` workarounds) registers into the copy and
    never into the next export's registry.
    **Upstream**: pytorch/pytorch ``torch/onnx/_internal/exporter/_registration.py`` (``from_torchlib`` is
    uncached; no issue found, torch 2.15).
    **Remove when**: torch.onnx caches the torchlib registry (the test counts the builds with
    ``disable=("_patch_torchlib_registry_built_once",)``).
    """

    @functools.wraps(original)
    def from_torchlib(cls: type, *args: Any, **kwargs: Any) -> Any:
        key = (cls, args, tuple(sorted(kwargs.items())), _sources_key())
        if key not in _BUILT:
            _BUILT.clear()
            _BUILT[key] = original.__func__(cls, *args, **kwargs)
        registry = copy.copy(_BUILT[key])
        registry.functions = {target: list(metas) for target, metas in registry.functions.items()}
        return registry

    return from_torchlib
