"""The sizes a program's own guards refuse inside its checked range, found by evaluating the guards.

A named ``Dim(min=, max=)`` that torch.export's solver refused is traced again as ``Dim.DYNAMIC`` over the same
range (``tracer._export_with_ranges_as_hints``). The program then keeps the solver's guards as checks that run on
every call (``ExportedProgram._guards_code``), and keeps the user's range as its range constraint. Most such
guards hold for every size in the range (``h <= 2*((h + 1)//2)``: padding to even sizes), but not all: a window
count that is 1 at the smallest sizes (``(s + 2) // 3 != 1``: the view's inferred size specialized away from
1) refuses them, and the caller got torch's "Guard failed" on a size the manifest said the program takes.
:func:`narrow_to_guards` evaluates the guards at every size of each dynamic dim's range (the other sizes at the
example's) and narrows the range constraint to the sizes they admit around the example, so that a refused size
is refused by name and range ("outside the program's range"), before the program runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["narrow_to_guards"]

# Sizes evaluated per dim at most: a range wider than this (an unbounded one) is left as it is.
MAX_SIZES = 1 << 14


class _Sizes:
    """What a guard reads of an input: ``L['x'].size()[1]``."""

    def __init__(self, shape: list[int]):
        self.shape = shape

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]


def _symbols(program: torch.export.ExportedProgram, examples: Mapping[str, Any]) -> dict[Any, list[tuple[str, int]]]:
    """``{symbol: [(input name, dim), ...]}`` of the top-level tensor inputs' dynamic dims."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if len(specs) != len(examples):  # a pytree input: its leaves do not line up with the names
        return {}
    found: dict[Any, list[tuple[str, int]]] = {}
    for name, spec in zip(examples, specs, strict=True):
        value = placeholders[spec.arg.name].meta.get("val") if hasattr(spec.arg, "name") else None
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                found.setdefault(size.node.expr, []).append((name, dim))
    return found


def narrow_to_guards(program: torch.export.ExportedProgram, examples: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Narrow each dynamic dim's range constraint of ``program`` to the sizes its guards admit around the
    example's size; returns what changed: ``{"inputs": [(name, dim), ...], "range": [min, max], "admitted":
    [min, max], "guards": [...]}`` each (the guards that refuse a size of the old range).

    A dim whose admitted sizes are not one interval (a parity guard) is narrowed to the interval around the
    example. Nothing changes when the program has no guards, a guard cannot be evaluated here (it reads more
    than input sizes), or a range is wider than ``MAX_SIZES``.
    """
    code = list(getattr(program, "_guards_code", None) or [])
    if not code:
        return []
    try:
        guards = [(text, compile(text, "<guard>", "eval")) for text in code]
    except SyntaxError:
        return []
    shapes = {name: _Sizes([int(s) for s in value.shape]) for name, value in examples.items()
              if isinstance(value, torch.Tensor)}
    scope = {"torch": torch, "math": math}
    changes = []
    for symbol, places in _symbols(program, examples).items():
        bounds = program.range_constraints.get(symbol)
        if bounds is None or not bounds.lower.is_integer or not bounds.upper.is_integer:
            continue
        low, high = int(bounds.lower), int(bounds.upper)
        if high - low > MAX_SIZES:
            continue
        example = shapes[places[0][0]].shape[places[0][1]]

        def refusing(size: int, places: list[tuple[str, int]] = places, example: int = example) -> list[str]:
            for name, dim in places:
                shapes[name].shape[dim] = size
            try:
                return [text for text, guard in guards if not eval(guard, scope, {"L": shapes})]  # noqa: S307
            finally:
                for name, dim in places:
                    shapes[name].shape[dim] = example

        try:
            if refusing(example):  # the traced size itself: the guards do not read as evaluated here
                continue
            lower = example
            while lower > low and not refusing(lower - 1):
                lower -= 1
            upper = example
            while upper < high and not refusing(upper + 1):
                upper += 1
            refused = sorted({text for size in (lower - 1, upper + 1) if low <= size <= high
                              for text in refusing(size)})
        except Exception:  # noqa: BLE001  a guard reads something other than sizes
            continue
        if (lower, upper) == (low, high):
            continue
        from torch.utils._sympy.value_ranges import ValueRanges

        program._range_constraints[symbol] = ValueRanges(lower, upper)
        changes.append({"inputs": places, "range": [low, high], "admitted": [lower, upper], "guards": refused})
    return changes
