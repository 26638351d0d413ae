"""Bit shifts for the ONNX fixes and translations: every torch spelling of a shift as one tensor-by-tensor
overload per direction (FX), and its ONNX lowering with the input's dtype kept for unsigned integers."""

from __future__ import annotations

import contextlib
from typing import Any

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

__all__ = ["SHIFT_SPELLINGS", "UNSIGNED", "bitshift", "shift_as_tensor_op"]

aten = torch.ops.aten

# Every overload a shift traces to -> the one it becomes (both operands tensors of the result's dtype).
SHIFT_SPELLINGS: dict[Any, Any] = {
    spelling: target.Tensor
    for target, dunder in ((aten.bitwise_right_shift, aten.__rshift__), (aten.bitwise_left_shift, aten.__lshift__))
    for spelling in (dunder.Tensor, dunder.Scalar, target.Tensor_Scalar, target.Scalar_Tensor)
}
UNSIGNED = (ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64)


def _as_tensor_of(gm: torch.fx.GraphModule, node: torch.fx.Node, arg: Any, dtype: torch.dtype) -> Any:
    """``arg`` (a tensor node or a Python scalar) as a tensor node of ``dtype``, inserted before ``node``."""
    result = node.meta["val"]
    fake_mode = getattr(result, "fake_mode", None)
    if isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype == dtype:
            return arg
        new = gm.graph.call_function(aten._to_copy.default, (arg,), {"dtype": dtype})
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            fake = val.to(dtype)
    else:
        new = gm.graph.call_function(aten.scalar_tensor.default, (arg,), {"dtype": dtype})
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            fake = torch.scalar_tensor(arg, dtype=dtype, device=result.device)
    new.meta = {k: v for k, v in node.meta.items() if k != "val"}  # nn_module_stack for torch.onnx
    new.meta["val"] = fake
    return new


def shift_as_tensor_op(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Rewrites a shift of any spelling (``x >> 4``, ``1 << t``, ``__rshift__.Tensor``, ...) as
    ``bitwise_{right,left}_shift.Tensor(a, b)`` with both operands tensors of the result's dtype."""
    target = SHIFT_SPELLINGS.get(node.target) if node.op == "call_function" else None
    result = node.meta.get("val")
    if target is None or not isinstance(result, torch.Tensor) or len(node.args) != 2:
        return False
    with gm.graph.inserting_before(node):
        a, b = (_as_tensor_of(gm, node, arg, result.dtype) for arg in node.args)
    node.target, node.args = target, (a, b)
    return True


def bitshift(self: Any, other: Any, direction: str) -> Any:
    """ONNX ``BitShift`` of two integer tensors of one dtype, eager's semantics: a plain ``BitShift`` for unsigned
    dtypes (ONNX's own; the result keeps the dtype), torchlib's for signed ones (an arithmetic right shift)."""
    from onnxscript.function_libs.torch_lib.ops.core import aten_bitwise_left_shift, aten_bitwise_right_shift

    dtype = self.dtype if self.dtype is not None else other.dtype
    if dtype in UNSIGNED:
        return op.BitShift(self, op.CastLike(other, self), direction=direction)
    return (aten_bitwise_right_shift if direction == "RIGHT" else aten_bitwise_left_shift)(self, other)
