"""Stage 1, Torch patches: ``@register_patch("onnx", ...)`` factories, active while capturing and lowering."""

from __future__ import annotations

from typing import Any

import torch

from hfexport.plugin import register_patch

__all__: list[str] = []


def _float_scalar_with_int_tensor(tensor: Any, other: Any) -> bool:
    return (isinstance(tensor, torch.Tensor) and isinstance(other, float) and not tensor.dtype.is_floating_point
            and not tensor.dtype.is_complex and tensor.dtype != torch.bool)


@register_patch("onnx", "torch.Tensor.__rsub__")
def _patch_tensor_rsub(original: Any) -> Any:
    """``python_float - int_tensor``: the tensor cast to the default float dtype first (eager's promotion).

    **Why**: ``1.0 - int_mask`` (c18) traces to ``aten.rsub.Scalar``, which torch.onnx's type promotion refuses:
    ``Cannot find a compatible OpOverload for aten.sub``; of the float-by-int-tensor operators only this one fails.
    **Upstream**: pytorch/pytorch#194381 (regression in 2.13; fix proposed in pytorch/pytorch#194522); history in
    microsoft/onnxscript#1907 and #2137.
    **Remove when**: pytorch/pytorch#194381 is fixed in the minimum torch (c18 exports with ``disable=`` of this
    patch, ``_patch_torch_rsub`` and ``_fix_sub_scalar_int_tensor``).
    """

    def __rsub__(self: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
        if _float_scalar_with_int_tensor(self, other):
            self = self.to(torch.get_default_dtype())
        return original(self, other, *args, **kwargs)

    return __rsub__


@register_patch("onnx", "torch.rsub")
def _patch_torch_rsub(original: Any) -> Any:
    """``torch.rsub(int_tensor, python_float)``: the tensor cast first, as ``_patch_tensor_rsub`` does.

    **Why**: ``torch.rsub`` traces to the same ``aten.rsub.Scalar`` and fails the same way.
    **Upstream**: pytorch/pytorch#194381 (fix proposed in pytorch/pytorch#194522).
    **Remove when**: pytorch/pytorch#194381 is fixed in the minimum torch.
    """

    def rsub(input: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
        if _float_scalar_with_int_tensor(input, other):
            input = input.to(torch.get_default_dtype())
        return original(input, other, *args, **kwargs)

    return rsub
