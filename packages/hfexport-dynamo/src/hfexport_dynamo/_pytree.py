"""Pytree registration for transformers ``Cache`` classes (and their layers) by attribute walking.

``torch.export`` only accepts inputs and outputs whose types are registered pytree nodes
(pytorch/pytorch#136582, #148748: "Found DynamicCache in output/input, not a known type"). transformers
registers its ``ModelOutput`` subclasses itself; caches are not registered. Every ``Cache`` subclass and
every cache layer class is registered here with one generic flatten: the tensor-valued attributes (and
lists of layers) are the children, every other attribute goes into the context. A type whose state the
walk cannot reach (tensors hidden in a dict, say) gets its own ``child_attrs`` through
:func:`register_cache_type`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["register_cache_type", "register_transformers_pytrees", "registered_types"]

logger = logging.getLogger("hfexport")
_REGISTERED: dict[type, tuple[str, ...] | None] = {}


def _is_child(value: Any) -> bool:
    """A tensor, a registered object, or a list, tuple or dict of them (``None`` entries allowed, at least one
    tensor or registered object; nested containers too). A dict of tensors is a child so that its tensors are
    inputs of the program: ``LinearAttentionLayer.conv_states`` (``{state_idx: tensor}``, LFM2, Qwen3-Next, Mamba2
    hybrids), kept in the context, was a constant that forward mutates in place (f11)."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, list | tuple | dict):
        values = list(value.values()) if isinstance(value, dict) else list(value)
        if isinstance(value, dict) and not all(type(k) in (int, str) for k in value):
            return False
        return any(v is not None for v in values) and all(v is None or _is_child(v) for v in values)
    return type(value) in _REGISTERED


def _flatten(obj: Any) -> tuple[list[Any], Any]:
    fixed = _REGISTERED.get(type(obj))
    state = vars(obj)
    names = fixed if fixed is not None else tuple(k for k, v in state.items() if _is_child(v))
    static = tuple((k, None if _is_symbolic(v) else v) for k, v in state.items() if k not in names)
    return [state.get(k) for k in names], (type(obj), names, static)


def _is_symbolic(value: Any) -> bool:
    """A size traced from a dynamic dim (``DynamicSlidingWindowLayer.cumulative_length``, past + new tokens): it has
    no one value for a static context, which is copied and saved with the program's output spec. Kept, its SymInt
    carried the trace's shape environment into the spec, and torch.onnx's ``run_decompositions`` failed to deep-copy
    it (``Cannot access data pointer of Tensor (e.g. FakeTensor ...)``: DiffusionGemma). A rebuilt output cache has
    ``None`` there; eager's has the int."""
    return isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool)


def _unflatten(children: Any, context: Any) -> Any:
    cls, names, static = context
    obj = cls.__new__(cls)
    obj.__dict__.update(dict(static))
    obj.__dict__.update(zip(names, children, strict=True))
    return obj


def _flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], Any]:
    children, context = _flatten(obj)
    return [(pytree.GetAttrKey(n), c) for n, c in zip(context[1], children, strict=True)], context


# ── JSON context, so that a saved artifact's output spec can be read back (treespec_dumps) ──────────────
def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, type):
        return {"type": f"{value.__module__}:{value.__qualname__}"}
    if isinstance(value, list | tuple):
        return {"seq": [_encode(v) for v in value], "tuple": isinstance(value, tuple)}
    return {"repr": repr(value)}


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "dtype" in value:
        from hfexport.trust import torch_dtype

        dtype = torch_dtype(value["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a cache's saved context names dtype {value['dtype']!r}, which is not a torch dtype")
        return dtype
    if "device" in value:
        return torch.device(value["device"])
    if "type" in value:
        return _decode_type(str(value["type"]))
    if "seq" in value:
        items = [_decode(v) for v in value["seq"]]
        return tuple(items) if value["tuple"] else items
    return None  # a repr: not restorable, and not needed to run the artifact


def _decode_type(name: str) -> type:
    """A class a saved cache context names (``module:qualname``): a registered cache type, or a class defined in a
    transformers or torch module that is already imported, found in the module's own namespace (no module
    ``__getattr__``, which would import lazily). Nothing is imported by a name an artifact gives."""
    from hfexport import UntrustedArtifactError

    for cls in _REGISTERED:
        if f"{cls.__module__}:{cls.__qualname__}" == name:
            return cls
    module, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module) if module.split(".")[0] in ("transformers", "torch") else None
    for part in qualname.split("."):
        obj = vars(obj).get(part) if obj is not None and hasattr(obj, "__dict__") else None
    if not isinstance(obj, type):
        raise UntrustedArtifactError(f"a saved cache context names class {name!r:.120}, which is neither a registered "
                                     "cache type nor a class of an imported transformers or torch module: hfexport "
                                     "imports no module an artifact names")
    return obj


def _to_json(context: Any) -> str:
    import json

    cls, names, static = context
    return json.dumps({"cls": _encode(cls), "names": list(names), "static": [[k, _encode(v)] for k, v in static]})


def _from_json(text: str) -> Any:
    from hfexport.trust import parse_json

    data = parse_json(text)  # bounded depth and integers: a saved context is the artifact's text
    cls = _decode(data["cls"])
    if cls not in _REGISTERED:  # the class the context rebuilds must be one registered here
        raise ValueError(f"a saved cache context rebuilds {cls!r}, which is not a registered cache type")
    return cls, tuple(data["names"]), tuple((k, _decode(v)) for k, v in data["static"])


def register_cache_type(cls: type, child_attrs: tuple[str, ...] | None = None) -> bool:
    """Register ``cls`` as a pytree node by attribute walking; returns False if it already was.

    Args:
        cls: a ``Cache`` subclass, a cache layer class, or any state container passed to ``forward``.
        child_attrs: the attributes that hold tensors (or lists of registered objects); by default every
            attribute whose value is a tensor or a list of them when the object is flattened.
    """
    if cls in _REGISTERED or cls in pytree.SUPPORTED_NODES:
        return False
    _REGISTERED[cls] = child_attrs
    pytree.register_pytree_node(
        cls, _flatten, _unflatten, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=_flatten_with_keys, to_dumpable_context=_to_json, from_dumpable_context=_from_json,
    )
    return True


def _subclasses(root: type) -> list[type]:
    out, todo = [], [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def register_transformers_pytrees() -> list[str]:
    """Register every ``Cache`` subclass and cache layer class that transformers defines.

    Returns:
        The names of the classes registered by this call (empty when all already were).
    """
    cache_utils = importlib.import_module("transformers.cache_utils")
    roots = [getattr(cache_utils, n) for n in ("CacheLayerMixin", "LinearAttentionCacheLayerMixin", "DummyLayer",
                                                "Cache") if hasattr(cache_utils, n)]
    new = []
    for root in roots:
        for cls in [root, *_subclasses(root)]:
            if register_cache_type(cls):
                new.append(cls.__name__)
    return new


def registered_types() -> list[type]:
    return list(_REGISTERED)


def _admitted(cls: type) -> bool:
    """The pytree types an artifact's specs may name (``hfexport.trust.allow_pytree_types``): the cache types
    registered here, and transformers' ``ModelOutput`` subclasses (transformers registers them on definition)."""
    if cls in _REGISTERED:
        return True
    generic = sys.modules.get("transformers.utils.generic")
    model_output = getattr(generic, "ModelOutput", None)
    return isinstance(model_output, type) and issubclass(cls, model_output)


def _allow() -> None:
    from hfexport.trust import allow_pytree_types

    allow_pytree_types(_admitted)


_allow()
