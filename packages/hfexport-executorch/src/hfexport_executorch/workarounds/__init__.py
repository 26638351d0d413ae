"""The registered workarounds of the ExecuTorch backends, one module per kind (``exporter_executorch`` imports them,
and each stage's banner there names its module):

* ``torch_patches`` — stage 2, ``@register_patch("executorch", ...)``;
* ``executorch_patches`` — stage 3, ``@register_patch("executorch.internals", ...)``;
* ``xnnpack_patches`` — stage 3 for XNNPACK, ``@register_patch("executorch.xnnpack.internals", ...)``, and the
  XNNPACK quantizer's ``@register_patch("executorch.quantization", ...)``;
* ``node_fixes`` — stage 5, ``@register_fx_node_fix("executorch")`` and ``("executorch.xnnpack")``.

Stage 1's ``prepare_for_<variant>`` functions are the variants' definitions and stay in ``exporter_executorch``.
What every export needs (dim bounds and memory budget, the export-cost cache) is pipeline code, not here. Each
workaround's docstring says **Why**, **Upstream** and **Remove when**;
``grep -rnE "^def (_patch_|_fix_|_aten_|prepare_for_)" packages/hfexport-executorch/src`` lists them all.
"""
