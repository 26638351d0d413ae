"""Model patches (``"dynamo"`` scope): quantization-aware-trained models exported with their fake-quant modules.

A QAT model in eval keeps its ``FakeQuantize`` (or ``_LearnableFakeQuantize``, ``FusedMovingAvgObsFakeQuantize``)
modules: their forward branches on the ``observer_enabled`` / ``fake_quant_enabled`` (``static_enabled``) buffers.
``torch.export`` sees those buffers as data, so every backend fails on a data-dependent guard; the fake-quant ops
themselves have no ONNX function for every overload, are not Core ATen for ExecuTorch, and OpenVINO's frontend does
not convert them from an ExportedProgram. Here, for the length of an export:

- each fake-quant module's flags are read once from the real model before the trace (they are constant in eval):
  a disabled fake-quant is the identity, an enabled one computes the fake-quant op; an enabled observer (which
  would recompute the scale from every input) is refused with the module's name and the call that disables it;
- the fake-quant ops (``torch.fake_quantize_per_tensor_affine``, ``..._per_channel_affine`` and the learnable
  ``torch._fake_quantize_learnable_*``) run as their decomposition, ``(clamp(round(x * (1 / scale)) + zero_point,
  quant_min, quant_max) - zero_point) * scale`` in float32, in the order of ATen's CPU kernel: bit-identical to
  it (round half to even, the reciprocal taken in float32; with a float zero point, ATen's order and a float64
  product).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from hfexport.plugin import register_patch

__all__ = ["fake_quantize_decomposed"]


def fake_quantize_decomposed(x: torch.Tensor, scale: Any, zero_point: Any, quant_min: int, quant_max: int,
                             axis: int | None = None) -> torch.Tensor:
    """``torch.fake_quantize_per_tensor_affine`` (``axis=None``) or ``..._per_channel_affine`` as plain ops.

    Args:
        x: a float16/32/64 tensor.
        scale: a Python float, a one-element tensor (per tensor) or a ``[x.shape[axis]]`` tensor (per channel).
        zero_point: an int, or an int/float tensor shaped like ``scale``. An integer zero point is added after the
            rounding, a float one before it (ATen's two kernels).
        quant_min, quant_max: the integer range.
        axis: the channel axis, or ``None`` for per-tensor.

    Returns:
        A tensor of ``x``'s shape and dtype, bit-identical to ATen's CPU kernel (which computes in float32).
    """
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device).float()
    zero_point = torch.as_tensor(zero_point, device=x.device)
    shape = [1] * x.dim()
    if axis is not None:
        shape[axis] = -1
    scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    # The per-tensor kernel computes in float32 for every input dtype, the per-channel one in the input's (float64
    # stays float64); both multiply by the float32 1.0f / scale, never divide.
    dtype = torch.float64 if axis is not None and x.dtype == torch.float64 else torch.float32
    scaled = x.to(dtype) * torch.reciprocal(scale).to(dtype)
    if zero_point.is_floating_point():  # ATen's float zero point: rounded with it, the product in float64
        zero = zero_point.to(dtype)
        q = torch.round(scaled + zero).clamp(quant_min, quant_max)
        return ((q.double() - zero.double()) * scale.double()).to(x.dtype)
    zero = zero_point.to(dtype)  # an integer: exact in float32, so the float32 product equals the kernel's
    q = (torch.round(scaled) + zero).clamp(quant_min, quant_max)
    return ((q - zero) * scale.to(dtype)).to(x.dtype)


def _learnable_zero_point(zero_point: torch.Tensor, quant_min: int, quant_max: int) -> torch.Tensor:
    """The learnable ops' integer zero point: rounded (half to even) and clamped, as ATen does."""
    return zero_point.round().clamp(quant_min, quant_max).to(torch.int32)


@register_patch("dynamo", "torch.fake_quantize_per_tensor_affine", "torch.fake_quantize_per_channel_affine",
                "torch._fake_quantize_learnable_per_tensor_affine", "torch._fake_quantize_learnable_per_channel_affine")
def _patch_fake_quantize_ops(original: Any) -> Any:
    """Decompose the fake-quant ops into round/clamp/multiply, bit-identical to ATen's CPU kernel.

    **Why**: ``aten.fake_quantize_per_*_affine`` (and the learnable variants) are not Core ATen (ExecuTorch
    rejects them), torch.onnx has no function for the tensor-qparams and learnable overloads, and OpenVINO's
    frontend fails on them from an ExportedProgram. The decomposition is exact (see the module docstring); the
    gradient-only arguments (``grad_factor``) do not change the forward value.
    **Upstream**: pytorch/pytorch#167063 (fake-quant in eval does not export), openvinotoolkit/openvino#30608.
    **Remove when**: every backend lowers the fake-quant ops of an exported program (f05 and s71 pass with
    ``disable=("_patch_fake_quantize_ops",)``).
    """
    name = getattr(original, "__name__", "")

    def per_tensor(input: torch.Tensor, scale: Any, zero_point: Any, quant_min: int, quant_max: int) -> torch.Tensor:
        return fake_quantize_decomposed(input, scale, zero_point, quant_min, quant_max)

    def per_channel(input: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, quant_min: int,
                    quant_max: int) -> torch.Tensor:
        return fake_quantize_decomposed(input, scale, zero_point, quant_min, quant_max, axis)

    def learnable_per_tensor(input: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, quant_min: int,
                             quant_max: int, grad_factor: float = 1.0) -> torch.Tensor:
        zero = _learnable_zero_point(zero_point.reshape(-1)[:1], quant_min, quant_max)
        return fake_quantize_decomposed(input, scale.reshape(-1)[:1], zero, quant_min, quant_max)

    def learnable_per_channel(input: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int,
                              quant_min: int, quant_max: int, grad_factor: float = 1.0) -> torch.Tensor:
        zero = _learnable_zero_point(zero_point, quant_min, quant_max)
        return fake_quantize_decomposed(input, scale, zero, quant_min, quant_max, axis)

    return {"fake_quantize_per_tensor_affine": per_tensor, "fake_quantize_per_channel_affine": per_channel,
            "_fake_quantize_learnable_per_tensor_affine": learnable_per_tensor,
            "_fake_quantize_learnable_per_channel_affine": learnable_per_channel}.get(name, original)


def _flag(module: torch.nn.Module, name: str) -> bool:
    return bool(getattr(module, name)[0].item() == 1)


def _constants(module: torch.nn.Module) -> dict[str, Any]:
    """The module's flags (``observer_enabled``, ``fake_quant_enabled``, ``static_enabled``: bools) and ``eps``
    (a float), read from its real buffers."""
    constants: dict[str, Any] = {f: _flag(module, f) for f in ("observer_enabled", "fake_quant_enabled",
                                                                 "static_enabled")
                                 if isinstance(getattr(module, f, None), torch.Tensor)}
    if isinstance(getattr(module, "eps", None), torch.Tensor):
        constants["eps"] = float(module.eps.reshape(-1)[0].item())
    return constants


def _constants_of(known: weakref.WeakKeyDictionary, module: torch.nn.Module) -> tuple[str, dict[str, Any]]:
    if module in known:
        return known[module]
    from torch._subclasses.fake_tensor import is_fake  # a module the model did not hold before the trace

    if any(is_fake(t) for t in module.buffers(recurse=False)):
        raise ValueError(f"{type(module).__name__}: its fake-quant flags are data during the trace; make it a "
                         "submodule of the model before exporting")
    return type(module).__name__, _constants(module)


def _refuse_observer(name: str, module: torch.nn.Module, flag: str) -> None:
    raise ValueError(
        f"{type(module).__name__} {name!r} has {flag}=1: its forward recomputes scale and zero_point from every "
        "input, which an exported program cannot keep. Freeze the quantization parameters before exporting: "
        "model.apply(torch.ao.quantization.disable_observer)")


@register_patch("dynamo", "torch.ao.quantization.fake_quantize.FakeQuantize.forward",
                "torch.ao.quantization.fake_quantize.FusedMovingAvgObsFakeQuantize.forward",
                "torch.ao.quantization._learnable_fake_quantize._LearnableFakeQuantize.forward")
def _patch_fake_quantize_modules(original: Any, ctx: Any = None) -> Any:
    """Run fake-quant modules with their ``observer_enabled`` / ``fake_quant_enabled`` flags as constants.

    **Why**: ``FakeQuantize.forward`` branches on ``self.observer_enabled[0] == 1`` and
    ``self.fake_quant_enabled[0] == 1`` (``_LearnableFakeQuantize``: ``static_enabled``; the fused module passes
    them to ``fused_moving_avg_obs_fake_quant``): buffers, which torch.export traces as data, so every backend
    fails with ``GuardOnDataDependentSymNode``. In eval with the observer off they are constant: the replacement
    reads them from the model before the trace and runs the fake-quant op (decomposed by
    ``_patch_fake_quantize_ops``) or the identity; an observer left on is refused by name.
    **Upstream**: pytorch/pytorch#167063 (open).
    **Remove when**: torch.export specializes on the fake-quant flags (f05 passes with
    ``disable=("_patch_fake_quantize_modules",)``).
    """
    from torch.ao.quantization.fake_quantize import FakeQuantizeBase

    # {module: (name, constants)} for every fake-quant module of the exported model, read before the trace; a scan
    # of the model, nothing else, where it holds none
    known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    model = getattr(ctx, "model", None)
    for name, module in model.named_modules() if model is not None else ():
        if isinstance(module, FakeQuantizeBase):
            known[module] = (name or type(module).__name__, _constants(module))

    def fake_quantize(self: Any, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        name, constants = _constants_of(known, self)
        if constants.get("observer_enabled"):
            _refuse_observer(name, self, "observer_enabled")
        if not constants.get("fake_quant_enabled"):
            return X
        qmin, qmax = self.activation_post_process.quant_min, self.activation_post_process.quant_max
        if self.is_per_channel:
            return torch.fake_quantize_per_channel_affine(X, self.scale, self.zero_point, self.ch_axis, qmin, qmax)
        return torch.fake_quantize_per_tensor_affine(X, self.scale, self.zero_point, qmin, qmax)

    def learnable(self: Any, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        name, constants = _constants_of(known, self)
        if constants.get("static_enabled"):
            _refuse_observer(name, self, "static_enabled")
        if not constants.get("fake_quant_enabled"):
            return X
        scale = self.scale.clamp(min=constants["eps"])  # eager clamps the buffer in place; the same value
        zero_point = self.zero_point
        if self.qscheme in (torch.per_channel_symmetric, torch.per_tensor_symmetric):
            zero_point = torch.zeros_like(zero_point)
        if self.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine):
            return torch._fake_quantize_learnable_per_channel_affine(X, scale, zero_point, self.ch_axis,
                                                                     self.quant_min, self.quant_max, 1.0)
        return torch._fake_quantize_learnable_per_tensor_affine(X, scale, zero_point, self.quant_min, self.quant_max,
                                                                1.0)

    return learnable if getattr(original, "__qualname__", "").startswith("_Learnable") else fake_quantize
