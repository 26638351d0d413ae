"""The types an artifact's text names, resolved without an import by a name it gives (see :mod:`hfexport._trust`
for the whole list of checks): pytree specs read by hfexport's own reader (:func:`load_treespec`: allow-listed
types, plain JSON contexts, nothing imported), the types a tracer admits (:func:`allow_pytree_types`), the modules
of output types imported only through an allow-list (:func:`import_type_modules`), and dtypes looked up among
torch's own (:func:`torch_dtype`). Nothing here imports torch at import time.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any

from ._trust import JSON_MAX_DEPTH, UntrustedArtifactError, parse_json

__all__ = ["TREESPEC_MAX_NODES", "allow_pytree_types", "allowed_pytree_type", "check_treespec",
           "import_type_modules", "importable_prefixes", "load_treespec", "torch_dtype", "treespec_names",
           "unregistered"]


# ── pytree specs: hfexport's own reader, allow-listed types, no import by name ──────────────────────────
_BUILTIN_PYTREE_TYPES = {"builtins.tuple": tuple, "builtins.list": list, "builtins.dict": dict}
_PYTREE_PREDICATES: list[Any] = []
TREESPEC_MAX_NODES = 100_000


def torch_dtype(name: Any) -> Any:
    """The ``torch.dtype`` that ``name`` names (``"float32"``, ``"torch.float32"``), or ``None``: looked up among the
    dtypes torch defines, never with ``getattr(torch, name)``, whose module ``__getattr__`` imports the submodule a
    name such as ``"onnx"`` or ``"_inductor"`` names. A dtype in a manifest or a spec is the artifact's text."""
    return _torch_dtypes().get(name.removeprefix("torch.")) if isinstance(name, str) else None


def _torch_dtypes() -> dict[str, Any]:
    import torch

    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        _TORCH_DTYPES = {key: value for key, value in vars(torch).items() if isinstance(value, torch.dtype)}
    return _TORCH_DTYPES


_TORCH_DTYPES: dict[str, Any] | None = None


def allow_pytree_types(predicate: Any) -> None:
    """Admit the registered pytree types for which ``predicate(cls)`` is true in artifacts' specs (a tracer's
    allow-list: transformers' ``ModelOutput`` subclasses and cache types). Nothing is imported to find them: a type
    is admitted only when it is already registered in this process."""
    if predicate not in _PYTREE_PREDICATES:
        _PYTREE_PREDICATES.append(predicate)


def allowed_pytree_type(name: Any) -> type | None:
    """The Python type a serialized pytree type name stands for, when the allow-list admits it: ``tuple``,
    ``list``, ``dict``, ``collections.OrderedDict``, and registered types a tracer admits
    (:func:`allow_pytree_types`). ``None`` otherwise (``collections.defaultdict`` included: its context names a
    module that torch imports)."""
    if not isinstance(name, str):
        return None
    if name in _BUILTIN_PYTREE_TYPES:
        return _BUILTIN_PYTREE_TYPES[name]
    if name == "collections.OrderedDict":
        import collections

        return collections.OrderedDict
    pytree = sys.modules.get("torch.utils._pytree")
    cls = getattr(pytree, "SERIALIZED_TYPE_TO_PYTHON_TYPE", {}).get(name) if pytree is not None else None
    if isinstance(cls, type) and any(_safe_predicate(p, cls) for p in _PYTREE_PREDICATES):
        return cls
    return None


def _safe_predicate(predicate: Any, cls: type) -> bool:
    try:
        return bool(predicate(cls))
    except Exception:  # noqa: BLE001 - a predicate that fails admits nothing
        return False


def _plain_json(value: Any) -> bool:
    """JSON of strings, numbers, booleans, null and lists of them (a context naming no module or callable)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_plain_json(v) for v in value)
    return False


def load_treespec(spec: Any, where: str) -> Any:
    """Read a ``treespec_dumps`` string with hfexport's own reader: every type admitted by
    :func:`allowed_pytree_type`, every context plain JSON (no object, so no ``__enum__`` that names a module), or
    the type's own ``from_dumpable_context`` for a tracer's types; nothing imported, at most
    :data:`TREESPEC_MAX_NODES` nodes.

    Raises:
        UntrustedArtifactError: a type outside the allow-list, or a context that names a module or callable.
        ValueError: not a serialized pytree spec.
    """
    import torch.utils._pytree as pytree

    if not isinstance(spec, str):
        raise ValueError(f"{where} is not a serialized pytree spec: {spec!r:.80}")
    try:
        protocol, schema = parse_json(spec, max_depth=2 * JSON_MAX_DEPTH)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} is not a serialized pytree spec: {exc} (the depth limit is "
                         f"hfexport._trust.JSON_MAX_DEPTH={JSON_MAX_DEPTH} nodes): the artifact is damaged or "
                         "crafted") from None
    if protocol != 1:
        raise ValueError(f"{where} is a pytree spec of protocol {protocol!r}; hfexport reads protocol 1")
    count = 0

    def build(node: Any) -> Any:
        nonlocal count
        count += 1
        if count > TREESPEC_MAX_NODES:
            raise ValueError(f"{where} has more than {TREESPEC_MAX_NODES:,} nodes")
        if not isinstance(node, dict) or not isinstance(node.get("children_spec"), list):
            raise ValueError(f"{where} is not a serialized pytree spec")
        name, context, children = node.get("type"), node.get("context"), node["children_spec"]
        if name is None and context is None and not children:
            return pytree._LEAF_SPEC if hasattr(pytree, "_LEAF_SPEC") else pytree.LeafSpec()
        cls = allowed_pytree_type(name)
        if cls is None:
            raise UntrustedArtifactError(
                f"{where} names pytree type {name!r:.120}, which hfexport does not admit from an artifact (it admits "
                "tuple, list, dict, OrderedDict and the types its tracer allows; defaultdict and namedtuple name a "
                "module or class): import and register it before hfexport.load, or pass trust_remote_code=True")
        if not isinstance(context, str):
            raise ValueError(f"{where}: the context of a {name} node is not a string")
        node_def = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        if node_def is not None and node_def.from_dumpable_context is not None and cls not in (dict, list, tuple):
            value = node_def.from_dumpable_context(context)
        else:
            try:
                value = parse_json(context)
            except ValueError as exc:
                raise ValueError(f"{where}: the context of a {name} node: {exc}") from None
            if not _plain_json(value):
                raise UntrustedArtifactError(f"{where}: the context of a {name} node is {context!r:.120}, which is not "
                                             "plain JSON (an enum names a module that reading it would import)")
            if cls in (dict,) or name == "collections.OrderedDict" or cls not in (tuple, list):
                if not isinstance(value, list) or len(value) != len(children):
                    raise ValueError(f"{where}: the keys of a {name} node do not match its children")
        return pytree.TreeSpec(cls, value, [build(child) for child in children])

    try:
        return build(schema)
    except RecursionError:
        raise ValueError(f"{where} is nested deeper than Python's recursion allows (hfexport reads at most "
                         f"{JSON_MAX_DEPTH} levels of a spec): the artifact is damaged or crafted") from None


# ── output specs: only registered pytree types, no import by name ───────────────────────────────────────
def treespec_names(spec: str) -> tuple[set[str], set[str]]:
    """The serialized type names and the enum modules (``"__enum__"`` contexts) of a ``treespec_dumps`` string.

    Raises:
        ValueError: not a treespec string.
    """
    try:  # bounded: a spec nested 100,000 deep raised a bare RecursionError from json (issue 43)
        protocol, schema = parse_json(spec, max_depth=2 * JSON_MAX_DEPTH)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a serialized pytree spec ({exc}): {spec!r:.80}") from None
    types: set[str] = set()
    enums: set[str] = set()

    def context_enums(value: Any) -> None:
        if isinstance(value, dict):
            if "__enum__" in value:
                enums.add(str(value.get("fqn", "")).partition(":")[0])
            for v in value.values():
                context_enums(v)
        elif isinstance(value, list):
            for v in value:
                context_enums(v)

    todo = [schema]
    while todo:  # no recursion: the depth is bounded above, but the walk needs no stack either
        node = todo.pop()
        if not isinstance(node, dict):
            raise ValueError(f"not a serialized pytree spec: {spec!r:.80}")
        if node.get("type") is not None:
            types.add(str(node["type"]))
        context = node.get("context")
        if isinstance(context, str):
            try:
                context_enums(parse_json(context))
            except ValueError:
                pass
        children = node.get("children_spec") or []
        todo.extend(children if isinstance(children, list) else [])
    return types, enums


def unregistered(types: Iterable[str]) -> list[str]:
    """The serialized type names that are not registered pytree nodes in this process."""
    import torch.utils._pytree as pytree

    return sorted(t for t in types if t not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE)


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def importable_prefixes(type_name: str) -> list[str]:
    """The module names a serialized type name may live in, longest first (``a.b.C.D`` -> ``a.b.C``, ``a.b``,
    ``a``); empty for a name that is not a dotted identifier."""
    if not _DOTTED.fullmatch(type_name):
        return []
    parts = type_name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def import_type_modules(type_names: Iterable[str], allowed: Any = None) -> list[str]:
    """Import the module each serialized type name lives in (its pytree registration runs on import).

    Args:
        type_names: serialized type names (``transformers.modeling_outputs.BaseModelOutput``).
        allowed: ``allowed(module) -> bool``: only such modules are imported (default: any; callers without
            the user's ``trust_remote_code`` pass an allow-list).

    Returns:
        The modules imported.
    """
    import importlib
    import importlib.util

    imported = []
    for name in type_names:
        for module in importable_prefixes(name):
            if allowed is not None and not allowed(module):
                continue
            try:
                if module not in sys.modules and importlib.util.find_spec(module) is None:
                    continue
                importlib.import_module(module)
            except (ImportError, ValueError):
                continue
            imported.append(module)
            break
    return imported


def check_treespec(spec: str, where: str) -> None:
    """Refuse an output spec that names a type that is not a registered pytree node, or an enum of a module that
    is not imported: reading it would need an import by a name the artifact gives.

    Raises:
        UntrustedArtifactError: the names, and how to make them loadable.
    """
    load_treespec(spec, where)


