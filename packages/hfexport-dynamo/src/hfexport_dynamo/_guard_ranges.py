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
Every other trace goes through it too, ``exact`` (``export_step.export_with_shared_dims``): a ``Dim.AUTO`` dim that
the guards pin to one interval (a patch count tied to a fixed position table) gets that interval as its range.
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


def narrow_to_guards(program: torch.export.ExportedProgram, examples: Mapping[str, Any], *,
                     exact: bool = False, only: set[tuple[str, int]] | None = None) -> list[dict[str, Any]]:
    """Narrow each dynamic dim's range constraint of ``program`` to the sizes its guards admit around the
    example's size; returns what changed: ``{"inputs": [(name, dim), ...], "range": [min, max], "admitted":
    [min, max], "guards": [...]}`` each (the guards that refuse a size of the old range; ``max`` None: unbounded).

    A dim whose admitted sizes are not one interval (a parity guard) is narrowed to the interval around the
    example, or, with ``exact``, left as it is (its verification at another shape refuses it by the guard's
    name). Sizes are evaluated up to ``MAX_SIZES`` either side of the example: an unbounded range (``Dim.AUTO``)
    keeps its end where every size up to there is admitted, and ``exact`` takes the sizes past the interval as
    refused when every one of them up to there is. Nothing changes when the program has no guards or a guard
    cannot be evaluated here (it reads more than input sizes). ``only``: the ``(input name, dim)`` that may change
    (a symbol any of whose dims is not in it is left as it is); None: every one.

    ``exact`` is the ``Dim.AUTO`` case of SigLIP's vision tower without ``interpolate_pos_encoding``: its position
    table (``nn.Embedding`` of 196 positions at 224x224 and 16-pixel patches) is added to the patches, which
    pins the patch count (``(h // 16) * (w // 16) == 196``: no range can say so), and torch.export left the
    image dims dynamic from 16 up. The export verified the program at 16x16, where eager broadcasts one patch
    over the 196 positions while the ONNX graph (without the guards) reads its shapes as one patch: ORT's
    ``MultiHeadAttention`` failed (``Shape mismatch attempting to re-use buffer. {2,1,64} != {2,1,12544}``).
    The admitted sizes are [224, 239] for each dim, which the manifest now claims.
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
        if only is not None and not set(places) <= only:
            continue
        bounds = program.range_constraints.get(symbol)
        if bounds is None or not bounds.lower.is_integer or not bounds.upper.is_integer:
            continue
        try:
            low = int(bounds.lower)
        except (TypeError, AttributeError, OverflowError):
            continue
        try:
            high: int | None = int(bounds.upper)
        except (TypeError, AttributeError, OverflowError):  # int_oo: unbounded
            high = None
        # the guards that read this dim: the others do not change with its size
        if not exact and (high is None or high - low > MAX_SIZES):
            continue  # as for the relaxed named ranges: a range this wide is left as it is
        reads = tuple(f"L[{name!r}].size()[{dim}]" for name, dim in places)
        mine = [(text, guard) for text, guard in guards if any(r in text for r in reads)]
        if not mine:
            continue
        example = shapes[places[0][0]].shape[places[0][1]]
        first = max(low, example - MAX_SIZES)
        last = example + MAX_SIZES if high is None else min(high, example + MAX_SIZES)

        def refusing(size: int, places: list[tuple[str, int]] = places, example: int = example,
                     mine: list[Any] = mine) -> list[str]:
            for name, dim in places:
                shapes[name].shape[dim] = size
            try:
                return [text for text, guard in mine if not eval(guard, scope, {"L": shapes})]  # noqa: S307
            finally:
                for name, dim in places:
                    shapes[name].shape[dim] = example

        try:
            if refusing(example):  # the traced size itself: the guards do not read as evaluated here
                continue
            lower = example
            while lower > first and not refusing(lower - 1):
                lower -= 1
            upper = example
            while upper < last and not refusing(upper + 1):
                upper += 1
            if exact and not all(refusing(size) for size in (*range(first, lower), *range(upper + 1, last + 1))):
                continue  # admitted sizes past the interval: not a range
            refused = sorted({text for size in (lower - 1, upper + 1) if first <= size <= last
                              for text in refusing(size)})
        except Exception:  # noqa: BLE001  a guard reads something other than sizes
            continue
        # a scan that ended at the window's end (not at a refused size) keeps the range's end there
        new_low = low if lower == first else lower
        new_high = high if upper == last else upper
        if (new_low, new_high) == (low, high):
            continue
        from torch.utils._sympy.numbers import int_oo
        from torch.utils._sympy.value_ranges import ValueRanges

        program._range_constraints[symbol] = ValueRanges(new_low, int_oo if new_high is None else new_high)
        changes.append({"inputs": places, "range": [low, high], "admitted": [new_low, new_high], "guards": refused})
    return changes
