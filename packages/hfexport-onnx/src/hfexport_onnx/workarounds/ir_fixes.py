"""Stage 5, ONNX IR fixes: ``fix(graph) -> int`` rewrites of the converted model (the main graph and every function)
before the optimizer, each returning how many nodes it rewrote; registered as the ``onnx_ir_fix`` kind."""

from __future__ import annotations

import onnx_ir as ir

from hfexport.plugin import register_workaround

from .._dtypes import bfloat16_as_float32

__all__: list[str] = []


@register_workaround("onnx_ir_fix", "onnx")
def _fix_ir_topk_sorted(graph: ir.Graph | ir.Function) -> int:
    """``TopK(sorted=0)`` → ``TopK(sorted=1)``: sorted order, always a valid ``sorted=False`` result.

    **Why**: ONNX leaves the order of ``TopK(sorted=0)`` to the runtime: ONNX Runtime returns its heap order where
    eager sorts, so values, indices and anything order-sensitive downstream differed from eager's.
    **Upstream**: pytorch/pytorch#95613 (sort/topk ordering); ONNX ``TopK`` spec (the ``sorted`` attribute).
    **Remove when**: never needed by ONNX semantics; kept while exports are verified against eager.
    """
    changed = 0
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if node.op_type == "TopK" and node.domain in ("", "ai.onnx"):
            attr = node.attributes.get("sorted")
            if attr is not None and attr.value == 0:
                node.attributes["sorted"] = ir.AttrInt64("sorted", 1)
                changed += 1
    return changed


@register_workaround("onnx_ir_fix", "onnx")
def _fix_ir_bfloat16_as_float32(graph: ir.Graph | ir.Function) -> int:
    """bfloat16 computed in float32, a cast back after each of the model's casts to bfloat16 (its rounding kept).

    **Why**: ONNX Runtime's CPU provider has no bfloat16 kernel for most ops: ``NOT_IMPLEMENTED : Could not find an
    implementation for Add(14)`` (e05, a bfloat16 Roberta), ``MatMul(13)`` (a bfloat16 island, s54).
    **Upstream**: pytorch/pytorch#143643, microsoft/onnxruntime#26311.
    **Remove when**: ORT's CPU provider runs bfloat16 ``Add``/``MatMul`` (e05 exports with ``disable=`` of this fix).
    """
    return bfloat16_as_float32(graph)
