"""What the ONNX pipeline does with torch.onnx around ``torch.onnx.export``: its torchlib registry built once per
process, and its decomposition run by ``lower`` as a step of its own, so that stage 3's FX node fixes see the
decomposed program before torch.onnx's type promotion does.

``torch.onnx.export`` builds ``ONNXRegistry.from_torchlib()`` on every call (no cache in torch 2.15): for each of
onnxscript's ~500 torchlib functions it rebuilds the function's IR from its Python source, 0.3-0.5 s of CPU per export
(about 40% of a tiny module's warm export). Then it decomposes the program (``_core._prepare_exported_program_for_export``
→ ``_fx_passes.decompose_with_registry``, with a table derived from that registry), inserts its type promotion and
converts. ``lower`` runs that decomposition itself (:func:`decompose_with_registry`, with the registry torch.onnx
builds and under the settings it uses), applies stage 3's fixes to the result, and hands it to ``torch.onnx.export``
as already decomposed (:func:`decomposed_already`): decomposing a decomposed program again is not a no-op (it
retraces it, and fails on the ``prims`` view ops a ``vmap`` decomposes to: e02, s58, s59), and torch.onnx has no
option to skip its decomposition. :func:`torch_onnx_pipeline`, entered by ``lower`` around both steps, makes both
hold: the registry built once, and the decomposition skipped for the program ``lower`` decomposed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["decomposed_already", "decomposition_settings", "decompose_with_registry", "onnx_registry",
           "torch_onnx_pipeline"]

_BUILT: dict[tuple[Any, ...], Any] = {}  # (class, arguments, what the registry is built from) -> the built registry
_DECOMPOSED: dict[int, Any] = {}  # id -> a program lower decomposed, while torch.onnx.export converts it
_LOCK = threading.Lock()
_ORIGINALS: list[tuple[Any, Any]] = []  # (from_torchlib, decompose_with_registry) as found, once per installation


def _sources_key() -> tuple[int, int, int]:
    """What ``ONNXRegistry.from_torchlib`` reads: torch's own torchlib functions, onnxscript's torchlib registry,
    and the torch ops its names resolve to (a registry built before an op or a function was registered differs)."""
    import torch
    from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 - ops registers the functions
    from torch.onnx._internal.exporter._torchlib import _torchlib_registry

    _torchlib_registry.get_torchlib_ops()  # imports (registers) torch's own torchlib ops
    onnxscript_functions = sum(len(f.overloads) + len(f.complex) for f in registration.default_registry.values())
    return (len(_torchlib_registry._registry), onnxscript_functions, len(torch._C._dispatch_get_all_op_names()))


def _built_once(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ONNXRegistry.from_torchlib`` (the classmethod's function ``original``), cached; each call gets a copy whose
    lists of translations are its own, so that what one export registers (``custom_translation_table``) is never in
    the next export's registry."""

    @functools.wraps(original)
    def from_torchlib(cls: type, *args: Any, **kwargs: Any) -> Any:
        key = (cls, args, tuple(sorted(kwargs.items())), _sources_key())
        with _LOCK:
            if key not in _BUILT:
                _BUILT.clear()
                _BUILT[key] = original(cls, *args, **kwargs)
            built = _BUILT[key]
        registry = copy.copy(built)
        registry.functions = {target: list(metas) for target, metas in built.functions.items()}
        return registry

    return from_torchlib


def _skipped_when_decomposed(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch.onnx's ``decompose_with_registry``, returning a program ``lower`` decomposed as it is."""

    @functools.wraps(original)
    def decompose(exported_program: Any, registry: Any, *args: Any, **kwargs: Any) -> Any:
        if _DECOMPOSED.get(id(exported_program)) is exported_program:
            return exported_program
        return original(exported_program, registry, *args, **kwargs)

    return decompose


@contextlib.contextmanager
def torch_onnx_pipeline() -> Iterator[None]:
    """Within the body, ``ONNXRegistry.from_torchlib`` builds torch.onnx's registry once per process (and returns a
    copy of it), and ``torch.onnx.export`` does not decompose a program :func:`decomposed_already` names; restored when
    the last of the nested (or concurrent) bodies ends, also on error."""
    from torch.onnx._internal.exporter import _fx_passes
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    with _LOCK:
        if not _ORIGINALS:
            originals = (ONNXRegistry.__dict__["from_torchlib"], _fx_passes.decompose_with_registry)
            ONNXRegistry.from_torchlib = classmethod(_built_once(originals[0].__func__))  # type: ignore[method-assign]
            _fx_passes.decompose_with_registry = _skipped_when_decomposed(originals[1])
        else:
            originals = _ORIGINALS[0]
        _ORIGINALS.append(originals)
    try:
        yield
    finally:
        with _LOCK:
            originals = _ORIGINALS.pop()
            if not _ORIGINALS:
                ONNXRegistry.from_torchlib, _fx_passes.decompose_with_registry = originals  # type: ignore[method-assign]


def onnx_registry(table: Mapping[Any, Callable[..., Any]], opset_version: int) -> Any:
    """The registry ``torch.onnx.export(..., custom_translation_table=table, opset_version=...)`` builds: torchlib's
    functions at ``opset_version`` (at least torchlib's own opset, as torch.onnx asks), then ``table``'s."""
    from torch.onnx._internal.exporter import _constants, _registration

    registry = _registration.ONNXRegistry.from_torchlib(opset_version=max(opset_version, _constants.TORCHLIB_OPSET))
    for target, function in table.items():
        registry.register_op(target, function, is_complex=False)
    return registry


@contextlib.contextmanager
def decomposition_settings(program: Any) -> Iterator[None]:
    """The settings torch.onnx decomposes under (``_core._prepare_exported_program_for_export``): sizes 0 and 1
    kept symbolic (``backed_size_oblivious``), RNNs as ``while_loop`` when the program has dynamic shapes."""
    import torch
    from torch.onnx._internal.exporter import _capture_strategies

    with (torch.fx.experimental._config.patch(backed_size_oblivious=True),
          _capture_strategies.patch_dynamic_shape_rnn_decompositions(program.range_constraints)):
        yield


def decompose_with_registry(program: Any, registry: Any) -> Any:
    """``program`` decomposed as ``torch.onnx.export`` decomposes it with ``registry`` (torch.onnx's own function:
    torch's default and core decompositions minus the ops the registry translates); under
    :func:`decomposition_settings`."""
    from torch.onnx._internal.exporter import _fx_passes

    return _fx_passes.decompose_with_registry(program, registry)


@contextlib.contextmanager
def decomposed_already(program: Any) -> Iterator[None]:
    """Within the body, ``torch.onnx.export(program, ...)`` takes ``program`` as decomposed (under
    :func:`torch_onnx_pipeline`)."""
    with _LOCK:
        _DECOMPOSED[id(program)] = program
    try:
        yield
    finally:
        with _LOCK:
            _DECOMPOSED.pop(id(program), None)
