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
:func:`narrow_to_pins` does the same for ``Dim.AUTO`` dims after every trace, but only by the guards that pin an
expression of sizes to a constant (a patch count tied to a fixed position table), which no range can say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["narrow_to_guards", "narrow_to_pins"]

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


def _pins(program: torch.export.ExportedProgram, symbols: set[Any]) -> list[tuple[Any, Any, Any]]:
    """``(guard, its symbols in order, a function of their sizes)`` for each of the trace's guards (its ``ShapeEnv``'s)
    that pins an expression of ``symbols`` to a constant (``Eq(((s1//16))*((s2//16)), 196)``); torch's own printer
    writes each as Python."""
    import sympy
    from torch.utils._sympy.printers import PythonPrinter

    shape_env = next((getattr(getattr(v, "fake_mode", None), "shape_env", None) for v in
                      (n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder")
                      if isinstance(v, torch.Tensor)), None)
    out, seen = [], set()
    for guard in getattr(shape_env, "guards", None) or ():
        expr = guard.expr
        if not isinstance(expr, sympy.Eq) or expr in seen:
            continue
        seen.add(expr)
        lhs, rhs = expr.args
        if lhs.is_number == rhs.is_number or not expr.free_symbols or not expr.free_symbols <= symbols:
            continue  # a relation between sizes, not a value they are pinned to
        names = sorted(expr.free_symbols, key=str)
        try:
            code = compile(f"lambda {', '.join(map(str, names))}: {PythonPrinter().doprint(expr)}", "<pin>", "eval")
            function = eval(code, {"math": math, "torch": torch})  # noqa: S307  torch's printer's Python
        except Exception:  # noqa: BLE001  an expression the printer does not write as Python
            continue
        out.append((expr, names, function))
    return out


def narrow_to_pins(program: torch.export.ExportedProgram, examples: Mapping[str, Any],
                   dims: set[tuple[str, int]]) -> list[dict[str, Any]]:
    """Narrow the dynamic dims of ``dims`` (``(input name, dim)``; the ``Dim.AUTO`` ones) that a guard of the trace
    pins, an expression of input sizes equal to a constant, to the one interval around the example's size that the
    pinning guards admit (the other sizes at the example's), when they refuse every other size up to ``MAX_SIZES``
    either side; returns what changed, as :func:`narrow_to_guards` does (``guards``: the pinning guards).

    SigLIP's vision tower without ``interpolate_pos_encoding`` adds its position table (196 positions: 224x224
    images of 16-pixel patches) to the patches as they are, which pins the patch count: ``Eq(((h//16))*((w//16)),
    196)``. No range says that, and torch.export left the image dims dynamic from 16 up; the export's verification
    at 16x16 (one patch, which eager broadcasts over the 196 positions) failed in ORT's fused MultiHeadAttention
    (``{2,1,64} != {2,1,12544}``), the ONNX graph holding no guard. Each dim now claims [224, 239], where the patch
    grid stays 14x14: a box of sizes the program takes, whose smallest corner is verified, and a size outside it is
    refused by name and range before the program runs.

    Only pins narrow: an inequality between two dynamic sizes (ViT-MAE's ``noise.size(0) <= pixel_values.size(0)``)
    relates them and bounds neither, and evaluated with the other at the example's size it would cap a batch at
    the example's. A pin that admits sizes on both sides of a refused one is left as it is (the verification names
    its guard)."""
    every = _symbols(program, examples)
    found = {symbol: places for symbol, places in every.items() if set(places) <= dims}
    pins = _pins(program, set(every)) if found else []
    if not pins:
        return []
    hints = {symbol: int(examples[places[0][0]].shape[places[0][1]]) for symbol, places in every.items()}
    changes, boxes = [], {}
    for symbol, places in found.items():
        mine = [(expr, names, function) for expr, names, function in pins if symbol in names]
        bounds = program.range_constraints.get(symbol)
        if not mine or bounds is None:
            continue
        example = hints[symbol]
        try:
            low = int(bounds.lower)
        except (TypeError, AttributeError, OverflowError):
            continue
        try:
            high: int | None = int(bounds.upper)
        except (TypeError, AttributeError, OverflowError):  # int_oo: unbounded
            high = None
        first = max(low, example - MAX_SIZES)
        last = example + MAX_SIZES if high is None else min(high, example + MAX_SIZES)

        def admitted(size: int, symbol: Any = symbol, mine: list[Any] = mine) -> bool:
            return all(bool(function(*(size if name == symbol else hints[name] for name in names)))
                       for _, names, function in mine)

        try:
            if not admitted(example):  # the guards do not read as evaluated here
                continue
            lower = example
            while lower > first and admitted(lower - 1):
                lower -= 1
            upper = example
            while upper < last and admitted(upper + 1):
                upper += 1
            if any(admitted(size) for size in (*range(first, lower), *range(upper + 1, last + 1))):
                continue  # not pinned to one interval
        except Exception:  # noqa: BLE001  a pin that these sizes do not evaluate
            continue
        # a scan that ended at the window's end, not at a refused size, keeps the range's end there
        lower, upper = low if lower == first else lower, high if upper == last else upper
        if (lower, upper) != (low, high):
            boxes[symbol] = (low, high, lower, upper, places, [str(expr) for expr, _, _ in mine])
    if not boxes:
        return []
    # every corner of the box the narrowed dims make together: the program takes each of its sizes
    corners: list[dict[Any, int]] = [{}]
    for symbol, (_, _, lower, upper, _, _) in boxes.items():
        corners = [{**corner, symbol: size} for corner in corners
                   for size in dict.fromkeys((lower, hints[symbol] if upper is None else upper))]
    try:
        if not all(bool(function(*({**hints, **corner}[name] for name in names)))
                   for corner in corners for _, names, function in pins):
            return []
    except Exception:  # noqa: BLE001
        return []
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    for symbol, (low, high, lower, upper, places, guards) in boxes.items():
        program._range_constraints[symbol] = ValueRanges(lower, int_oo if upper is None else upper)
        changes.append({"inputs": places, "range": [low, high], "admitted": [lower, upper], "guards": guards})
    return changes
