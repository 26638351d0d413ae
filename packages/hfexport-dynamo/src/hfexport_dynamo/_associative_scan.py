"""Model patches (``"dynamo"`` scope): ``associative_scan`` run as a sequential ``scan`` over its axis.

``torch._higher_order_ops.associative_scan`` (Mamba/LRU-style gated recurrences written as a parallel scan) traces,
with ``combine_mode="pointwise"``, as the ``associative_scan`` higher-order op, which no runtime lowers (torch.onnx has
no function for it, ExecuTorch finds its combine ops not Edge operators, OpenVINO fails to convert it); with
``combine_mode="generic"`` as a tree of ``log2(length)`` strided slices, which specializes the scanned length. The
replacement folds the same ``combine_fn`` left to right, ``y_0 = x_0, y_t = combine_fn(y_{t-1}, x_t)``, as one
``torch.ops.higher_order.scan`` over the axis, which every backend lowers as a loop with a symbolic trip count. An
associative ``combine_fn`` gives the same values up to float rounding (the parallel scan associates differently).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._higher_order_ops.scan import scan

from hfexport.plugin import register_patch

__all__ = ["sequential_associative_scan"]


def sequential_associative_scan(combine: Callable[..., Any], leaves: list[torch.Tensor],
                                additional_inputs: tuple[Any, ...] = ()) -> list[torch.Tensor]:
    """An inclusive scan of ``leaves`` along dim 0, one step at a time.

    Args:
        combine: the flat combine, ``combine(*left_leaves, *right_leaves, *additional_inputs) -> leaves``, called on
            one element of each leaf (the leaf without its dim 0).
        leaves: tensors ``[length, ...]`` (the scanned axis first, as ``associative_scan`` moved it).
        additional_inputs: extra arguments of ``combine``.

    Returns:
        The scanned leaves, each shaped and typed like its input.
    """
    length = leaves[0].shape[0]
    if isinstance(length, int) and length < 2:
        return list(leaves)

    # Every element is scanned, the first one too (its step's combine is discarded): a scan over ``leaves[1:]``
    # would make torch.export assume length - 1 >= 2, and refuse a length of 2.
    def step(carry: list[torch.Tensor], xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        first, elements = xs[0], xs[1:]
        combined = torch.utils._pytree.tree_leaves(combine(*carry, *elements, *additional_inputs))
        out = [torch.where(first, e, torch.as_tensor(c).to(e.dtype)) for e, c in zip(elements, combined, strict=True)]
        return [o.clone() for o in out], [o.clone() for o in out]

    # the carry is a fresh contiguous tensor, as the step returns it (the leaves are views moved to dim 0)
    init = [leaf[0].clone(memory_format=torch.contiguous_format) for leaf in leaves]
    first = torch.arange(length, device=leaves[0].device) == 0
    _, ys = scan(step, init, [first, *leaves])
    return list(ys)


def _unvmapped(operator: Any) -> Any:
    """The user's combine inside ``associative_scan``'s generic wrapper (``partial(wrap_combine_fn_flat,
    combine_fn=torch.vmap(user))``), without the vmap: the sequential scan calls it on single elements."""
    inner = getattr(operator, "keywords", {}).get("combine_fn") if isinstance(operator, functools.partial) else None
    user = getattr(inner, "__wrapped__", None)  # torch.vmap's wrapper; under torch.export a closure over ``func``
    if user is None and inner is not None and inner.__closure__:
        user = dict(zip(inner.__code__.co_freevars, (c.cell_contents for c in inner.__closure__), strict=True)).get("func")
    if not callable(user):
        return None
    return functools.partial(operator.func, *operator.args, **dict(operator.keywords, combine_fn=user))


@register_patch("dynamo", "torch._higher_order_ops.associative_scan._maybe_compile_and_run_fn",
                "torch._higher_order_ops.associative_scan.generic_associative_scan")
def _patch_associative_scan_sequential(original: Any) -> Any:
    """Run ``associative_scan`` (pointwise and generic) as a sequential ``scan`` op over its axis.

    **Why**: the ``associative_scan`` higher-order op that the pointwise mode traces to has no lowering on any
    runtime (torch.onnx: ``No ONNX function found for AssociativeScanOp``; ExecuTorch: ``aten.mul.Tensor is not an
    Edge operator`` in its combine graph; OpenVINO: ``OpConversionFailure``), and the generic mode's log-depth
    tree of strided slices specializes the scanned length. The replacement (see the module docstring) folds the
    same combine function step by step as a ``scan`` op, which every backend lowers. The patched names are the two
    entry points that ``associative_scan`` calls for its two modes, so a model that imported ``associative_scan``
    before the export is covered too.
    **Upstream**: pytorch/pytorch#186594 (``associative_scan`` cannot be exported).
    **Remove when**: the backends lower the ``associative_scan`` op (f03 passes on onnx with
    ``disable=("_patch_associative_scan_sequential",)``).
    """
    if getattr(original, "__name__", "") == "generic_associative_scan":

        def generic(operator: Any, leaves: list[torch.Tensor], dim: int = 0,
                    additional_inputs: tuple[Any, ...] = ()) -> list[torch.Tensor]:
            combine = _unvmapped(operator)
            if dim != 0 or combine is None:
                return original(operator, leaves, dim=dim, additional_inputs=additional_inputs)
            return sequential_associative_scan(combine, list(leaves), tuple(additional_inputs))

        return generic

    def maybe_compile_and_run(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") != "run_flattened_associative_scan":
            return original(fn, *args)
        combine, leaves = args
        out = sequential_associative_scan(combine, list(leaves))
        spec = getattr(combine, "keywords", {}).get("spec")  # eager's op returns the structure of xs
        return torch.utils._pytree.tree_unflatten(out, spec) if spec is not None else out

    return maybe_compile_and_run
