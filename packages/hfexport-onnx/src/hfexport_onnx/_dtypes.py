"""bfloat16 on ONNX Runtime's CPU: the ONNX model rewritten to compute in float32, rounding to bfloat16 where the
model casts to it (the ``_fix_ir_bfloat16_as_float32`` IR fix)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

__all__ = ["bfloat16_as_float32"]

BF16, F32 = ir.DataType.BFLOAT16, ir.DataType.FLOAT
_DTYPE_ATTRIBUTES = ("to", "dtype")  # Cast(to=...), EyeLike/RandomNormal/...(dtype=...)


def _as_float32(tensor: Any, name: str | None = None) -> ir.Tensor:
    return ir.tensor(np.asarray(tensor.numpy(), dtype=np.float32), name=name)


def bfloat16_as_float32(graph: ir.Graph | ir.Function) -> int:
    """Every bfloat16 value of ``graph`` becomes float32, except the outputs of its casts to bfloat16, which are
    followed by a cast back to float32 (the model's rounding points are kept). Returns how many values, attributes
    and initializers changed.

    Initializers are widened (exactly), ``Constant``/``ConstantOfShape`` tensors too, ``Cast(to=bfloat16)``
    stays and gets a ``Cast(to=float)`` after it, other dtype attributes (``EyeLike``, ``Random*``) become float.
    Graph inputs and outputs in bfloat16 become float32 (the caller feeds and reads float32).
    """
    changed = 0
    kept: set[int] = set()  # the outputs of the model's own casts to bfloat16
    for node in list(ir.traversal.RecursiveGraphIterator(graph)):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR and attr.value.dtype == BF16:
                node.attributes[attr.name] = ir.AttrTensor(attr.name, _as_float32(attr.value))
                changed += 1
            elif (attr.type == ir.AttributeType.INT and attr.name in _DTYPE_ATTRIBUTES and attr.value == BF16
                  and not (node.op_type == "Cast" and node.domain in ("", "ai.onnx"))):
                node.attributes[attr.name] = ir.AttrInt64(attr.name, F32)
                changed += 1
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and node.attributes.get_int("to") == BF16:
            rounded = node.outputs[0]
            back = ir.node("Cast", [rounded], attributes={"to": F32})
            back.outputs[0].type, back.outputs[0].shape = ir.TensorType(F32), rounded.shape
            for user, index in list(rounded.uses()):
                if user is not back:
                    user.replace_input_with(index, back.outputs[0])
            node.graph.insert_after(node, back)
            if rounded.is_graph_output():
                outputs = node.graph.outputs
                outputs[outputs.index(rounded)] = back.outputs[0]
            kept.add(id(rounded))
            changed += 1
    values = [*graph.inputs, *graph.outputs, *getattr(graph, "initializers", {}).values()]
    values += [v for node in ir.traversal.RecursiveGraphIterator(graph) for v in (*node.inputs, *node.outputs)
               if v is not None]
    seen: set[int] = set()
    for value in values:
        if id(value) in seen or id(value) in kept or value.dtype != BF16:
            continue
        seen.add(id(value))
        value.type = ir.TensorType(F32)
        if value.const_value is not None:
            value.const_value = _as_float32(value.const_value, value.name)
        changed += 1
    return changed
