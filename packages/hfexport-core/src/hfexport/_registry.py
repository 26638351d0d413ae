"""The workaround registry: one list of registrations of open kinds, keyed by scope.

The kernel's kinds are ``"patch"``, ``"fx_node_fix"`` and ``"fx_program_fix"``; a backend declares its own
(``"onnx_translation"``, ``"onnx_ir_fix"``, ``"executorch_variant"``) with :func:`register_workaround`, and
listing, provenance and ``disable=`` work the same for every kind.

A *scope* is a dotted string: ``"dynamo"`` applies to every export, ``"onnx"`` to ONNX exports,
``"executorch"`` to every ExecuTorch variant and ``"executorch.cuda"`` to one variant only. An exporter
declares the scopes it activates (for example ``("dynamo", "executorch", "executorch.xnnpack")``).

Nothing here imports torch: registering a workaround is free, applying one is the exporter's business.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Registration",
    "is_disabled",
    "register_workaround",
    "register_patch",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "list_patches",
    "list_fx_node_fixes",
    "list_fx_program_fixes",
    "list_workarounds",
    "workarounds_for",
]

Kind = str  # "patch", "fx_node_fix", "fx_program_fix", or a kind a backend declares


@dataclass(frozen=True)
class Registration:
    """One registered workaround and where it came from.

    Attributes:
        kind: ``"patch"``, ``"fx_node_fix"``, ``"fx_program_fix"`` or a backend's own kind
            (``"onnx_translation"``).
        scope: the scope it is installed for (``"dynamo"``, ``"onnx"``, ``"executorch.cuda"``, ...).
        func: the registered function (a patch factory ``factory(original) -> replacement``, a node fix
            ``(graph_module, node) -> bool`` or a program fix ``(exported_program) -> None``).
        paths: for patches, the dotted paths the factory replaces; empty for fixes.
        module: the module that defined ``func``.
        name: the function's name (``_patch_...``, ``_fix_...``): the key used to disable it.
        summary: the first line of the function's docstring.
        qualname: the function's qualified name within its module.
        source: ``file:line`` of the definition.
        data: what the kind needs besides the function (an ONNX translation's ``target`` op, an ExecuTorch
            variant's name).
        takes_context: whether ``func`` has a ``ctx`` parameter (fixes that get the ExportContext).
    """

    kind: Kind
    scope: str
    func: Callable[..., Any]
    paths: tuple[str, ...] = ()
    module: str = ""
    name: str = ""
    summary: str = ""
    qualname: str = ""
    source: str = field(default="", compare=False)
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    takes_context: bool = field(default=False, compare=False)

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.qualname or self.name}"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (used in the export.json manifest)."""
        out: dict[str, Any] = {"kind": self.kind, "scope": self.scope, "name": self.qualified_name,
                               "summary": self.summary}
        if self.paths:
            out["paths"] = list(self.paths)
        out.update({k: v if isinstance(v, str | int | float | bool | type(None)) else str(v)
                    for k, v in self.data.items()})
        return out


_REGISTRY: list[Registration] = []


def _describe(func: Callable[..., Any]) -> tuple[str, str, str, str, str]:
    doc = inspect.getdoc(func) or ""
    summary = doc.strip().splitlines()[0] if doc.strip() else ""
    try:
        source = f"{inspect.getsourcefile(func)}:{inspect.getsourcelines(func)[1]}"
    except (OSError, TypeError):
        source = ""
    name = getattr(func, "__name__", repr(func))
    return getattr(func, "__module__", "") or "", name, getattr(func, "__qualname__", name), summary, source


def _check_scope(scope: str) -> None:
    if not isinstance(scope, str) or not scope or any(not part for part in scope.split(".")):
        raise ValueError(f"scope must be a dotted name such as 'dynamo' or 'executorch.cuda', got {scope!r}")


def _takes_context(func: Callable[..., Any]) -> bool:
    try:
        return "ctx" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def _add(kind: Kind, scope: str, func: Callable[..., Any], paths: tuple[str, ...] = (),
         data: dict[str, Any] | None = None) -> Registration:
    if not callable(func):
        raise TypeError(f"@register_{kind} decorates a function, got {func!r}")
    module, name, qualname, summary, source = _describe(func)
    entry = Registration(kind, scope, func, paths, module, name, summary, qualname, source, dict(data or {}),
                         _takes_context(func))
    # Re-importing a module (importlib.reload, a test re-running a registration) replaces, not duplicates.
    _REGISTRY[:] = [r for r in _REGISTRY if not (r.kind == kind and r.qualified_name == entry.qualified_name
                                                 and r.scope == scope)]
    _REGISTRY.append(entry)
    return entry


def register_workaround(kind: str, scope: str, **data: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a workaround of ``kind`` for ``scope``; ``data`` is kept on the :class:`Registration`.

    For kinds a backend declares, e.g. ``@register_workaround("onnx_translation", "onnx", target=aten.gelu.default)``.
    Listing (``hfexport workarounds``), provenance and ``disable=`` work as for the kernel's kinds.

    Raises:
        ValueError: ``kind`` is not an identifier or the scope is not a dotted name.
    """
    _check_scope(scope)
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ValueError(f"kind must be an identifier such as 'onnx_translation', got {kind!r}")

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        _add(kind, scope, func, data=data)
        return func

    return decorator


def register_patch(scope: str, *paths: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a patch factory, installed for exports in ``scope`` and reverted after them.

    The factory is called as ``factory(original)`` for each path and returns the replacement. A path
    names a module attribute, a class attribute or method, or a torch op: ``"torch.where"``,
    ``"torch.Tensor.view"``, ``"transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier"``.
    Paths are resolved only when the patch is installed, so registering costs no import.

    Args:
        scope: the scope, e.g. ``"dynamo"``, ``"onnx"``, ``"executorch"``, ``"executorch.cuda"``.
        *paths: one or more dotted paths that share this factory.

    Returns:
        A decorator that registers the factory and returns it unchanged.

    Raises:
        ValueError: if no path is given or the scope is not a dotted name.
    """
    _check_scope(scope)
    if not paths or not all(isinstance(p, str) and "." in p for p in paths):
        raise ValueError(f"register_patch({scope!r}, ...) needs dotted paths such as 'torch.where', got {paths!r}")

    def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
        _add("patch", scope, factory, tuple(paths))
        return factory

    return decorator


def register_fx_node_fix(scope: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fix(graph_module, node) -> bool``, applied to every node after tracing.

    The fix returns ``True`` when it rewrote or consumed the node (no later fix sees it). Dead code left
    behind is eliminated once all fixes have run. A fix with a ``ctx`` parameter also gets the ExportContext.

    Raises:
        ValueError: if the scope is not a dotted name.
    """
    return register_workaround("fx_node_fix", scope)


def register_fx_program_fix(scope: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fix(exported_program) -> None`` for rewrites that need the whole ExportedProgram.

    For example range constraints or placeholder metadata. Applied in registration order.

    Raises:
        ValueError: if the scope is not a dotted name.
    """
    return register_workaround("fx_program_fix", scope)


def _listing(kind: Kind, scope: str | None) -> list[Registration]:
    return [r for r in _REGISTRY if r.kind == kind and (scope is None or r.scope == scope)]


def list_patches(scope: str | None = None) -> list[Registration]:
    """Registered patches, in registration order (all scopes, or only ``scope``)."""
    return _listing("patch", scope)


def list_fx_node_fixes(scope: str | None = None) -> list[Registration]:
    """Registered FX node fixes, in registration order (all scopes, or only ``scope``)."""
    return _listing("fx_node_fix", scope)


def list_fx_program_fixes(scope: str | None = None) -> list[Registration]:
    """Registered FX program fixes, in registration order (all scopes, or only ``scope``)."""
    return _listing("fx_program_fix", scope)


def list_workarounds(scope: str | None = None, kind: str | None = None) -> list[Registration]:
    """Every registration (of every kind, or only ``kind``; of all scopes, or only ``scope``)."""
    return [r for r in _REGISTRY if (scope is None or r.scope == scope) and (kind is None or r.kind == kind)]


def is_disabled(func: Callable[..., Any] | Registration, disabled: Iterable[str]) -> bool:
    """Whether ``disabled`` names ``func``: by function name (``"_fix_ir_topk_sorted"``) or qualified name
    (``"hfexport_onnx.workarounds.ir_fixes._fix_ir_topk_sorted"``). The one place ``disable=`` is matched."""
    off = set(disabled)
    if isinstance(func, Registration):
        return func.name in off or func.qualified_name in off
    name = getattr(func, "__name__", "")
    qualified = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', name)}"
    return name in off or qualified in off


def workarounds_for(kind: Kind, scopes: Iterable[str], disabled: Iterable[str] = ()) -> list[Registration]:
    """Registrations of ``kind`` whose scope is one of ``scopes``, minus the ``disabled`` names.

    ``disabled`` holds function names (``"_fix_ir_topk_sorted"``) or qualified names
    (``"hfexport_onnx.workarounds.ir_fixes._fix_ir_topk_sorted"``); it lets a user (or a test) leave one
    workaround out to see what it fixes.
    """
    scopes = tuple(scopes)
    disabled = tuple(disabled)
    return [r for r in _REGISTRY if r.kind == kind and r.scope in scopes and not is_disabled(r, disabled)]
