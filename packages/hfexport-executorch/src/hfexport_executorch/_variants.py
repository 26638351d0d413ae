"""ExecuTorch variants: ``prepare_for_<variant>`` functions, registered in the kernel's registry (kind
``"executorch_variant"``), so that ``hfexport workarounds`` lists them and ``disable=`` leaves one out by name.

A variant's function moves the model and inputs to its device and dtype (:func:`place_model_and_inputs`) and
returns its partitioners (:class:`BackendPreparation`). Nothing here imports executorch.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from hfexport import list_backends, list_workarounds
from hfexport.plugin import ExportContext, Registration, register_workaround

__all__ = ["BackendPreparation", "backend_variants", "place_model_and_inputs", "register_backend_prepare",
           "require_executorch", "variant_registration"]

logger = logging.getLogger("hfexport")
VARIANT_KIND = "executorch_variant"

PrepareFunction = Callable[[ExportContext], "BackendPreparation | list[Any]"]


def require_executorch() -> None:
    """Raise an ImportError that names what to install when executorch is missing."""
    if importlib.util.find_spec("executorch") is None:
        raise ImportError("the ExecuTorch backends need executorch: pip install executorch "
                          "(or pip install hfexport-executorch, which brings it)")


@dataclass
class BackendPreparation:
    """What a ``prepare_for_<variant>`` function returns (a plain list of partitioners is short for this).

    Attributes:
        partitioners: passed to ``to_edge_transform_and_lower``; empty: every op runs on portable kernels.
        edge_compile_options: extra ``EdgeCompileConfig`` fields for this variant.
        memory_planning_options: ``MemoryPlanningPass`` arguments that override the config's ``alloc_*`` flags.
        backend_config_options: extra ``ExecutorchBackendConfig`` fields.
        decompositions: op -> decomposition, added to the table ``to_edge`` decomposes with (after hfexport's own):
            ops the partitioners do not take, expressed with ops they do. A decomposition that returns
            ``NotImplemented`` keeps the op whole.
        transform_passes: ``to_edge_transform_and_lower``'s ``transform_passes``: run on the edge program before
            partitioning.
        device: the device the model is traced on (recorded in the manifest).
        dtype: the floating dtype the program was traced in (float inputs are cast to it when run).
    """

    partitioners: list[Any] = field(default_factory=list)
    edge_compile_options: dict[str, Any] = field(default_factory=dict)
    memory_planning_options: dict[str, Any] = field(default_factory=dict)
    backend_config_options: dict[str, Any] = field(default_factory=dict)
    decompositions: dict[Any, Callable[..., Any]] = field(default_factory=dict)
    transform_passes: list[Any] = field(default_factory=list)
    device: str = "cpu"
    dtype: torch.dtype | None = None

    @classmethod
    def of(cls, result: BackendPreparation | list[Any] | None) -> BackendPreparation:
        """A prepare function's result as a :class:`BackendPreparation`."""
        return result if isinstance(result, BackendPreparation) else cls(list(result or []))


def register_backend_prepare(variant: str) -> Callable[[PrepareFunction], PrepareFunction]:
    """Register ``prepare_for_<variant>(ctx) -> BackendPreparation | list[partitioner]`` as an ExecuTorch variant.

    The function moves the model and inputs to the variant's device and dtype (use
    :func:`place_model_and_inputs`, which restores the model after the export) and returns the partitioners.
    The variant is then valid as ``ExecutorchConfig(backend=variant)``, and its workarounds are registered under
    the scope ``"executorch.<variant>"``. A vendor distribution ships an exporter subclass with ``variant`` set and
    declares it under the ``hfexport.backends`` entry points (see the test plugin ``hfexport-etportable``).
    It is a workaround of kind ``"executorch_variant"``: listed by ``hfexport workarounds`` and left out with
    ``disable=("prepare_for_<variant>",)`` (no device/dtype move, no partitioner).

    Raises:
        ValueError: ``variant`` is not an identifier, or is registered already by another function.
    """
    if not isinstance(variant, str) or not variant.isidentifier():
        raise ValueError(f"an ExecuTorch variant is an identifier such as 'xnnpack', got {variant!r}")

    def decorator(prepare: PrepareFunction) -> PrepareFunction:
        current = variant_registration(variant, load_plugins=False)
        qualified = f"{prepare.__module__}.{prepare.__qualname__}"
        if current is not None and current.qualified_name != qualified:
            raise ValueError(f"ExecuTorch variant {variant!r} is registered already by {current.qualified_name}")
        return register_workaround(VARIANT_KIND, "executorch", variant=variant)(prepare)

    return decorator


def _load_variant_plugins() -> None:
    """Import the exporters of installed ``executorch-*`` backends, so that their variants register themselves."""
    for info in list_backends():  # ours too: importing exporter_executorch registers xnnpack and cuda
        if info.name.startswith("executorch") and info.status == "ok" and info.backend is not None:
            try:
                info.backend.load_exporter()
            except Exception as exc:  # a broken plugin must not hide the others: say so and go on
                logger.warning("ExecuTorch variant plugin %s (%s) failed to load: %s", info.name, info.value, exc)


def _variants() -> dict[str, Registration]:
    return {r.data["variant"]: r for r in list_workarounds(kind=VARIANT_KIND)}


def variant_registration(variant: str, load_plugins: bool = True) -> Registration | None:
    """The registration of ``variant``'s prepare function (after loading the variant plugins if not found)."""
    found = _variants().get(variant)
    if found is None and load_plugins:
        _load_variant_plugins()
        found = _variants().get(variant)
    return found


def backend_variants(load_plugins: bool = True) -> list[str]:
    """The registered ExecuTorch variants (``xnnpack``, ``cuda``, and those of installed plugins), sorted."""
    if load_plugins:
        _load_variant_plugins()
    return sorted(_variants())


def place_model_and_inputs(ctx: ExportContext, device: str | torch.device, dtype: torch.dtype | None = None) -> None:
    """Move the model to ``device`` (and its floating parameters and buffers to ``dtype``) for this export; move
    the inputs likewise and make them contiguous.

    The model is moved back when the export ends (``ctx.stack``), also when it fails: a model that was already
    in place is not touched at all. The inputs are the export's own copies, never the caller's tensors.
    """
    device = torch.device(device)
    model = ctx.model
    tensors = [(m, kind, name, t) for m in model.modules()
               for kind, table in (("param", m._parameters), ("buffer", m._buffers))
               for name, t in table.items() if t is not None]

    def moved(t: torch.Tensor) -> bool:
        return t.device != device or (dtype is not None and t.is_floating_point() and t.dtype != dtype)

    if any(moved(t) for *_, t in tensors):
        saved = [(m, kind, name, t.data if kind == "param" else t) for m, kind, name, t in tensors]

        def restore() -> None:
            for m, kind, name, original in saved:
                if kind == "param":
                    m._parameters[name].data = original
                else:
                    m._buffers[name] = original

        ctx.stack.callback(restore)
        model.to(device=device)
        if dtype is not None:
            model.to(dtype=dtype)  # floating parameters and buffers only

    def convert(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device=device)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t.contiguous()

    ctx.inputs = {name: pytree.tree_map_only(torch.Tensor, convert, value) for name, value in ctx.inputs.items()}
