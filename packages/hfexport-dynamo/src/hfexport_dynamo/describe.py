"""Descriptions of a captured program for the manifest (its inputs, outputs and dynamic dims), and the inputs of the
second-shape check (each dynamic size moved within its range)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from hfexport.artifact import flatten_with_names

logger = logging.getLogger("hfexport")

__all__ = ["describe_inputs", "describe_outputs", "second_shape_inputs"]


def _resized(tensor: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``tensor`` truncated, or extended by repeating its leading slices, to ``size`` along ``dim``."""
    if size <= tensor.shape[dim]:
        return tensor.narrow(dim, 0, size).clone()
    if tensor.dim() == 1 and tensor.numel() > 1 and not tensor.is_floating_point() \
            and bool((tensor[1:] >= tensor[:-1]).all()):
        # a sorted index (cumulative sequence lengths, offsets) extended with its last value stays sorted, where
        # a copy of its leading values would not (searchsorted over [0, 3, 5, 8, 0] has no defined answer)
        return torch.cat([tensor, tensor[-1:].expand(size - tensor.shape[0])])
    parts, have = [tensor], tensor.shape[dim]
    while have < size:
        take = min(tensor.shape[dim], size - have)
        parts.append(tensor.narrow(dim, 0, take))
        have += take
    return torch.cat(parts, dim=dim)


def second_shape_inputs(program: torch.export.ExportedProgram | None, inputs: Mapping[str, Any], *,
                        smallest: bool = False) -> dict[str, Any] | None:
    """See :meth:`DynamoTracer.second_shape_inputs`."""
    if program is None:
        return None
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = [placeholders[s.arg.name].meta.get("val") if hasattr(s.arg, "name") else None for s in specs]
    leaves, spec = pytree.tree_flatten(dict(inputs))
    if len(leaves) != len(vals):
        return None  # inputs folded in as constants, or a container the program sees otherwise
    shape_env = next((getattr(getattr(v, "fake_mode", None), "shape_env", None) for v in vals
                      if isinstance(v, torch.Tensor)), None)
    if shape_env is None:
        return None
    symbols: dict[Any, int] = {}
    for val in vals:
        for size in val.shape if isinstance(val, torch.Tensor) else ():
            if _is_dynamic(size):
                for symbol in size.node.expr.free_symbols:
                    hint = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
                    hint = hint.get(symbol)
                    if hint is not None:
                        symbols[symbol] = int(hint)
    moved: dict[Any, int] = {}
    for symbol, hint in symbols.items():
        rng = program.range_constraints.get(symbol)
        if smallest:  # the range's least size (1 for a count of images, chunks, rows), where below the example
            moved[symbol] = min(hint, max(1, int(rng.lower))) if rng is not None else hint
            continue
        lower = max(2, int(rng.lower)) if rng is not None else 2
        try:
            upper = int(rng.upper) if rng is not None else hint + 1
        except (TypeError, OverflowError, AttributeError):  # int_oo
            upper = hint + 1
        moved[symbol] = hint + 1 if hint + 1 <= upper else hint - 1 if hint - 1 >= lower else hint
    if smallest:
        _raise_to_derived_ranges(moved, symbols, vals, program)
    if all(moved[s] == symbols[s] for s in moved):
        return None
    out = []
    for leaf, val in zip(leaves, vals, strict=True):
        if isinstance(leaf, torch.Tensor) and isinstance(val, torch.Tensor):
            for dim, size in enumerate(val.shape):
                if _is_dynamic(size):
                    leaf = _resized(leaf, dim, max(0, int(size.node.expr.xreplace(moved))))
        out.append(leaf)
    return pytree.tree_unflatten(out, spec)


def _raise_to_derived_ranges(moved: dict[Any, int], hints: Mapping[Any, int], vals: list[Any],
                             program: torch.export.ExportedProgram) -> None:
    """Raise the symbols of ``moved`` (each at its own least size) until every dim that is an expression of several
    (a growing cache's ``attention_mask`` of ``past + seq`` positions) is within the range torch.export recorded for
    that expression; each symbol goes up by one at a time and never past its example size (``hints``), which is in
    range."""
    exprs = {size.node.expr for val in vals if isinstance(val, torch.Tensor) for size in val.shape
             if _is_dynamic(size) and len(size.node.expr.free_symbols) > 1}
    for _ in range(sum(hints.values()) + 1):
        low = [e for e in exprs if (rng := program.range_constraints.get(e)) is not None
               and int(e.xreplace(moved)) < int(rng.lower)]
        if not low:
            return
        for symbol in low[0].free_symbols:
            if symbol in moved and moved[symbol] < hints[symbol]:
                moved[symbol] += 1


def _spec_modules(spec: Any) -> set[str]:
    out = set()
    if spec.type is not None and spec.type.__module__ not in ("builtins", "collections"):
        out.add(spec.type.__module__)
    for child in spec.children():
        out |= _spec_modules(child)
    return out


def _is_dynamic(size: Any) -> bool:
    """Whether a traced size is symbolic (a SymInt whose symbol was replaced by a constant is not)."""
    return isinstance(size, torch.SymInt) and not getattr(size.node.expr, "is_number", False)


def _dims(value: Any, program: torch.export.ExportedProgram) -> tuple[list[Any], dict[str, Any]]:
    shape, dynamic = [], {}
    for i, size in enumerate(value.shape):
        if _is_dynamic(size):
            symbol = size.node.expr
            rng = program.range_constraints.get(symbol)
            try:
                upper = int(rng.upper) if rng is not None else None
            except (TypeError, AttributeError, OverflowError):  # int_oo: unbounded
                upper = None
            dynamic[str(i)] = {"symbol": str(symbol), "min": int(rng.lower) if rng else None, "max": upper}
            shape.append(str(symbol))
        else:
            shape.append(int(size))
    return shape, dynamic


def _user_input_values(program: torch.export.ExportedProgram) -> list[Any]:
    """The traced values (``meta["val"]``: fake tensors, ints) of the program's user inputs, flat, in order."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    return [placeholders[s.arg.name].meta.get("val") for s in specs if hasattr(s.arg, "name")]


def describe_inputs(program: torch.export.ExportedProgram, examples: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Name, dtype, shape (symbols for dynamic dims) and dynamic dims of every user input leaf."""
    leaves = _user_input_values(program)
    in_spec = program.call_spec.in_spec.children()[0]  # (args, kwargs) -> args
    out, offset = [], 0
    for name, child in zip(examples, in_spec.children(), strict=True):
        n = child.num_leaves
        entry: dict[str, Any] = {"name": name, "leaves": n}
        vals = [v for v in leaves[offset:offset + n] if isinstance(v, torch.Tensor)]
        if n == 1 and vals:
            entry["dtype"] = str(vals[0].dtype).replace("torch.", "")
            entry["shape"], entry["dynamic_dims"] = _dims(vals[0], program)
            if isinstance(examples.get(name), torch.Tensor):
                entry["example_shape"] = list(examples[name].shape)
        else:
            entry["type"] = str(child.type.__name__) if child.type else "leaf"
        out.append(entry)
        offset += n
    return out


def describe_outputs(program: torch.export.ExportedProgram) -> list[dict[str, Any]]:
    """Name (dotted pytree path), dtype and shape of every output leaf."""


    spec = program.call_spec.out_spec
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    user_outputs = [s for s in program.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
    vals = {a.name: a.meta.get("val") for a in output_node.args[0] if isinstance(a, torch.fx.Node)}
    # Tensor placeholders (not ints): attribute-walked cache types classify their children by type.
    names, _, _ = flatten_with_names(pytree.tree_unflatten([torch.empty(0)] * spec.num_leaves, spec))
    if len(names) != len(user_outputs):
        logger.warning("output spec has %d leaves but the program %d user outputs: names may be off",
                       len(names), len(user_outputs))
    out = []
    for name, s in zip(names, user_outputs, strict=False):
        val = vals.get(getattr(s.arg, "name", None))
        entry: dict[str, Any] = {"name": name}
        if isinstance(val, torch.Tensor):
            entry["dtype"] = str(val.dtype).replace("torch.", "")
            entry["shape"], _ = _dims(val, program)
        out.append(entry)
    return out


