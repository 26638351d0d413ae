"""Model patches (``"dynamo"`` scope): ``while_loop`` as a bounded number of masked iterations, when asked.

``torch._higher_order_ops.while_loop`` traces to the ``while_loop`` op, which torch.onnx and OpenVINO lower and
ExecuTorch does not (its emitter rejects it: pytorch/executorch#8769). With ``while_loop_max_iterations=N`` (a
``DynamoConfig`` option, so every backend's) each ``while_loop`` is traced as ``N`` copies of its body, each
followed by ``carried = where(cond(carried), body(carried), carried)``: the iterations after the condition turns
false change nothing, and a loop that would run more than ``N`` times stops at ``N``. Without the option nothing
changes but a clone of the carried tensors (the ExecuTorch backend refuses a remaining ``while_loop`` and names the option).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from hfexport.plugin import register_patch

__all__ = ["masked_while_loop"]


def masked_while_loop(cond_fn: Any, body_fn: Any, carried: tuple[Any, ...], iterations: int) -> tuple[Any, ...]:
    """The flat ``while_loop(cond_fn, body_fn, carried)`` unrolled ``iterations`` times with masked updates.

    Args:
        cond_fn: ``cond_fn(*carried) -> bool tensor`` (one element).
        body_fn: ``body_fn(*carried) -> carried'`` (the same structure, shapes and dtypes).
        carried: the flat tensors carried through the loop.
        iterations: the bound; the loop's value when its condition turns false within it.

    Returns:
        The flat carried tensors after the loop.
    """
    carried = tuple(carried)
    for _ in range(iterations):
        going = torch.as_tensor(cond_fn(*carried)).reshape(())
        updated = pytree.tree_leaves(body_fn(*carried))
        carried = tuple(torch.where(going, new, old) for new, old in zip(updated, carried, strict=True))
    return carried


@register_patch("dynamo", "torch._higher_order_ops.utils._hop_compile_and_call")
def _patch_while_loop_entry(original: Any, ctx: Any = None) -> Any:
    """Trace ``while_loop`` with its carried tensors cloned, or, with ``while_loop_max_iterations``, as that many
    masked iterations.

    **Why**: (1) a tensor that is both carried and read by the body as a closure (``body(h) = f(h) + x`` with
    ``x`` the initial ``h``: s76, s77) enters the op twice, as a carried and as an additional input, and
    ``run_decompositions`` (ONNX, OpenVINO, ExecuTorch) then fails with ``cond_fn might be aliasing the input or the
    output!``; the carried ones are cloned first (once per loop, not per iteration). (2) ExecuTorch's emitter has
    no ``while_loop`` (``Unsupported control flow operator: while_loop``, f04), and a data-dependent trip count
    cannot be unrolled without a bound: the user's bound makes it a fixed number of masked steps.
    **Upstream**: (1) pytorch/pytorch, while_loop's alias check counts one tensor passed twice (no issue found);
    (2) pytorch/executorch#8769 (``while_loop`` and ``scan`` in ExecuTorch; open).
    **Remove when**: (1) s76 exports on onnx with ``disable=("_patch_while_loop_entry",)``; (2) ExecuTorch emits
    ``while_loop`` (f04 lowers on executorch-xnnpack without the option).
    """
    iterations = getattr(getattr(ctx, "config", None), "while_loop_max_iterations", None)

    def hop_compile_and_call(fn: Any, args: Any) -> Any:
        if getattr(fn, "__name__", "") != "_while_loop_op_wrapper":
            return original(fn, args)
        cond_fn, body_fn, carried, additional = args
        if iterations is not None and not additional and all(isinstance(c, torch.Tensor) for c in carried):
            return masked_while_loop(cond_fn, body_fn, carried, iterations)
        carried = tuple(c.clone() if isinstance(c, torch.Tensor) else c for c in carried)
        return original(fn, (cond_fn, body_fn, carried, additional))

    return hop_compile_and_call
