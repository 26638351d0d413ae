"""Stage 3, FX node fixes: ``@register_fx_node_fix("onnx")`` rewrites of the captured program, applied again by
``lower`` to the program torch.onnx's decomposition makes (the step ``ExportedProgram.run_decompositions``)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from hfexport.plugin import register_fx_node_fix

from .._bitwise import shift_as_tensor_op

__all__: list[str] = []

aten = torch.ops.aten


def _is_int_tensor_node(arg: Any) -> bool:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return (isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and not val.dtype.is_complex
            and val.dtype != torch.bool)


@register_fx_node_fix("onnx")
def _fix_sub_scalar_int_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``aten.sub.Tensor(1.0, int_tensor)`` → ``aten.sub.Tensor(1.0, _to_copy(int_tensor, float))`` (eager's promotion).

    **Why**: traced without ``_patch_tensor_rsub``, ``1.0 - int_mask`` (c18) decomposes to this pattern, which
    torch.onnx's type promotion refuses (``Cannot find a compatible OpOverload for aten.sub``); it exists only in the
    decomposed program, where ``lower`` applies the fixes again.
    **Upstream**: pytorch/pytorch#194381 (regression in 2.13; fix proposed in pytorch/pytorch#194522).
    **Remove when**: pytorch/pytorch#194381 is fixed in the minimum torch.
    """
    if (node.op != "call_function" or node.target is not aten.sub.Tensor or len(node.args) < 2
            or not isinstance(node.args[0], float) or not _is_int_tensor_node(node.args[1])):
        return False
    x = node.args[1]
    val = x.meta["val"]
    out_val = node.meta.get("val")
    dtype = out_val.dtype if isinstance(out_val, torch.Tensor) else torch.get_default_dtype()
    with gm.graph.inserting_before(node):
        cast = gm.graph.call_function(aten._to_copy.default, (x,), {"dtype": dtype})
    cast.meta = {k: v for k, v in node.meta.items() if k != "val"}  # keeps nn_module_stack for torch.onnx
    fake_mode = getattr(val, "fake_mode", None)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        cast.meta["val"] = val.to(dtype)
    node.replace_input_with(x, cast)
    return True


@register_fx_node_fix("onnx")
def _fix_bitwise_shift_spellings(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Every spelling of a shift as ``bitwise_{right,left}_shift.Tensor(a, b)``, a scalar as a 0-d tensor.

    **Why**: torchlib has no function for ``__rshift__.Tensor`` (``DispatchError``, s50, s51), and the other
    spellings reach its signed-only lowering instead of ``_aten_bitwise_right_shift``.
    **Upstream**: none found for the missing registrations (torchlib ``ops/core.py``; microsoft/onnxscript#258).
    **Remove when**: torchlib registers every shift overload with unsigned dtypes kept (s51 exports with
    ``disable=("_fix_bitwise_shift_spellings",)``).
    """
    return shift_as_tensor_op(gm, node)

