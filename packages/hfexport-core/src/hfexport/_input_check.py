"""Inputs of a call to an exported program, checked against its manifest before any runtime runs.

The manifest's ``inputs`` describe every top-level tensor input: ``dtype``, ``shape`` (ints for static dims,
symbols such as ``"s0"`` for dynamic ones) and ``dynamic_dims`` (``{"1": {"symbol": "s0", "min": 2, "max": 64}}``).
A wrong dtype, a wrong rank, a static dim of another size, a dynamic dim outside its range, or two dims that
share a symbol but differ in size are named here (input, what it is, what the program takes) instead of
failing inside torch, ONNX Runtime or ExecuTorch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["check_call_inputs", "describe_input"]


def _static(spec: Any) -> int | None:
    """The size of a static dim (an int, or a symbol torch specialized to a number: ``"3"``), else ``None``."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec
    if isinstance(spec, str) and spec.isdigit():
        return int(spec)
    return None


def _bounds(entry: Mapping[str, Any], dim: int) -> tuple[int | None, int | None]:
    """``(min, max)`` a dynamic dim is checked against; a min of 2 or less is not enforced (torch.export records 2
    for dims it lets be 0 or 1 at run time), ``None`` means unbounded."""
    info = (entry.get("dynamic_dims") or {}).get(str(dim)) or {}
    low, high = info.get("min"), info.get("max")
    return (low if isinstance(low, int) and low > 2 else None), (high if isinstance(high, int) else None)


def describe_input(entry: Mapping[str, Any]) -> str:
    """``"int64 [s0, s1] with s0 in [1, 64], s1 in [1, inf)"``: what a manifest input entry takes."""
    shape = [str(s) for s in entry.get("shape", [])]
    ranges = []
    for i, spec in enumerate(entry.get("shape", [])):
        if _static(spec) is None:
            low, high = _bounds(entry, i)
            ranges.append(f"{spec} in [{low or 1}, {high if high is not None else 'inf'}"
                          f"{']' if high is not None else ')'}")
    text = f"{entry.get('dtype', '?')} [{', '.join(shape)}]"
    return text + (f" with {', '.join(ranges)}" if ranges else " (static shape)")


def check_call_inputs(entries: Sequence[Mapping[str, Any]], inputs: Mapping[str, Any], what: str) -> dict[str, Any]:
    """Check ``inputs`` against the manifest's input ``entries``; return them, floating inputs cast to the
    program's floating dtype (as the file-backed runtimes do, so that every backend behaves alike).

    Entries without ``dtype`` and ``shape`` (caches and other pytree inputs, non-tensor leaves) are not checked.

    Args:
        entries: the component's manifest ``inputs``.
        inputs: the call's keyword inputs (names already checked).
        what: how errors name the program (``"this dynamo export"``).

    Raises:
        TypeError: an input that is not a tensor, or of another dtype (other than float for float).
        ValueError: a rank, a static size, a dynamic range or a shared dynamic size that does not fit.
    """
    import torch

    out = dict(inputs)
    seen: dict[str, tuple[str, int]] = {}  # symbol -> (where it was first seen, its size)
    for entry in entries:
        name, dtype, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
        if name not in inputs or dtype is None or shape is None:
            continue
        value = inputs[name]
        expected = f"{what} takes {name} as {describe_input(entry)}"
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"input {name!r} is a {type(value).__name__}, not a tensor; {expected}: pass "
                            f"torch.as_tensor({name})")
        from ._named_types import torch_dtype

        want = torch_dtype(dtype)
        have = str(value.dtype).replace("torch.", "")
        if isinstance(want, torch.dtype) and value.dtype != want:
            if value.is_floating_point() and want.is_floating_point:
                out[name] = value.to(want)
            else:
                raise TypeError(f"input {name!r} is {have}; {expected}: pass {name}.to(torch.{dtype})")
        if value.dim() != len(shape):
            raise ValueError(f"input {name!r} has {value.dim()} dims (shape {list(value.shape)}); {expected}")
        for i, (size, spec) in enumerate(zip(value.shape, shape, strict=True)):
            size = int(size)
            static = _static(spec)
            if static is not None:
                if size != static:
                    raise ValueError(
                        f"input {name!r} has size {size} in dim {i} (shape {list(value.shape)}); {expected}: dim {i} "
                        f"is static ({static}); re-export with dynamic=True or a dynamic_shapes entry for "
                        f"{name!r} dim {i} to vary it")
                continue
            low, high = _bounds(entry, i)
            if (high is not None and size > high) or (low is not None and size < low):
                raise ValueError(f"input {name!r} has size {size} in dim {i} (shape {list(value.shape)}), outside "
                                 f"the program's range for {spec}; {expected}")
            if isinstance(spec, str) and spec.isidentifier():
                where, first = seen.setdefault(spec, (f"{name!r} dim {i}", size))
                if first != size:
                    raise ValueError(f"input {name!r} has size {size} in dim {i}, but {where} is {first}: both are "
                                     f"{spec} in {what}, so they must be equal")
    return out
