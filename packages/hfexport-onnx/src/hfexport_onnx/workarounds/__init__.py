"""The ONNX backend's registered workarounds, one module per stage (importing this package registers them all).

Each waits for an upstream fix or a model-side change and says **Why**, **Upstream** and **Remove when**; leave one
out with ``disable=("<function name>",)``. ``grep -rnE "^def (_patch_|_fix_|_aten_)" hfexport_onnx/workarounds``
lists them.

- ``torch_patches``: stage 1, Torch patches (``@register_patch("onnx", ...)``).
- ``onnx_patches``: stage 2, ONNX patches (``@register_patch("onnx.toolchain", ...)``: torch.onnx and onnxscript).
- ``node_fixes``: stage 3, FX node fixes (``@register_fx_node_fix("onnx")``).
- ``translations``: stage 4, ONNX translations (``_aten_*``, the ``onnx_translation`` kind).
- ``ir_fixes``: stage 5, ONNX IR fixes (``_fix_ir_*``, the ``onnx_ir_fix`` kind).
"""

from . import ir_fixes, node_fixes, onnx_patches, torch_patches, translations

__all__ = ["ir_fixes", "node_fixes", "onnx_patches", "torch_patches", "translations"]
