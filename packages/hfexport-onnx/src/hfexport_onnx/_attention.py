"""The lowering of ``hfexport::cache_attention`` (a generation program's cache write and attention, one op:
``hfexport_dynamo._cache_attention``) to ONNX Runtime's ``com.microsoft.GroupQueryAttention``.

GroupQueryAttention writes the new positions into its present buffers and attends over the first
``seqlens_k + 1`` positions only; when the present buffers are the past ones (IO binding: :func:`in_place_outputs`
of ``_runner.py``) it copies nothing else. A decode step then costs what attention reads at the current context,
not at the cache's capacity, as in ONNX Runtime GenAI's decoders. The kernel's contract (onnxruntime
``contrib_ops/cpu/bert/gqa_attention_base.h``, ``docs/ContribOperators.md``): query ``[batch, seq, heads * dim]``,
key/value ``[batch, seq, kv_heads * dim]``, past/present ``[batch, kv_heads, capacity, dim]``, ``seqlens_k`` int32
``[batch]`` = total positions - 1, ``total_sequence_length`` int32 scalar, ``attention_bias`` ``[batch, 1, seq,
total]`` added to the scores (the padding and window mask here; the kernel applies the causal one itself).

With the op's rotary tables, the query and the new keys are rotated first by ONNX Runtime's ``RotaryEmbedding``
(``com.microsoft``, halves form: ``interleaved=0``), one node each, from ``cos_cache``/``sin_cache`` ``[positions,
head_dim / 2]`` at each token's ``position_ids``. GroupQueryAttention's own rotary (``do_rotary``) is not used: its
CPU kernel takes a row's first position and counts up from it (measured on onnxruntime 1.32: positions ``[0, 1, 2,
3, 4, 5, 0]`` rotate the last key as position 6), where a left-padded row's positions restart after its padding.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch
from onnxscript import opset18 as op
from onnxscript.values import Op, Opset

from hfexport_dynamo import cache_attention  # noqa: F401  (registers hfexport::cache_attention)

__all__ = ["lowerings"]

_MICROSOFT = Opset("com.microsoft", 1)


def _gqa_schema() -> Any:
    """GroupQueryAttention's signature, as far as this lowering uses it: onnxscript builds a node from a schema,
    and the ``com.microsoft`` ones live in ONNX Runtime, not in ``onnx.defs``."""
    from onnx.defs import OpSchema

    def inputs(*names: str, optional: tuple[str, ...] = ()) -> list[Any]:
        kinds = {"seqlens_k": "M", "total_sequence_length": "M", "position_ids": "P"}  # (position_ids: unused)
        return [OpSchema.FormalParameter(n, kinds.get(n, "T"), "",
                                         param_option=OpSchema.FormalParameterOption.Optional if n in optional
                                         else OpSchema.FormalParameterOption.Single) for n in names]

    optional = ("key", "value", "past_key", "past_value", "cos_cache", "sin_cache", "position_ids", "attention_bias")
    return OpSchema(
        "GroupQueryAttention", "com.microsoft", 1,
        inputs=inputs("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
                      "cos_cache", "sin_cache", "position_ids", "attention_bias", optional=optional),
        outputs=inputs("output", "present_key", "present_value"),
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], ""),
                          ("P", ["tensor(int64)"], "")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, ""),
                    OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, ""),
                    OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "")])


def _rotary_schema() -> Any:
    """RotaryEmbedding's signature (``com.microsoft``, ONNX Runtime's ``contrib_defs``), as far as it is used here."""
    from onnx.defs import OpSchema

    def parameter(name: str, kind: str) -> Any:
        return OpSchema.FormalParameter(name, kind, "")

    return OpSchema(
        "RotaryEmbedding", "com.microsoft", 1,
        inputs=[parameter("input", "T"), parameter("position_ids", "M"), parameter("cos_cache", "T"),
                parameter("sin_cache", "T")],
        outputs=[parameter("output", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int64)"], "")],
        attributes=[OpSchema.Attribute("interleaved", OpSchema.AttrType.INT, ""),
                    OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "")])


def _rotary(x: Any, rotary_cos: Any, rotary_sin: Any, position_ids: Any, heads: int) -> Any:
    """RoPE of ``x [batch, seq, heads * dim]`` at each token's ``position_ids`` (``com.microsoft.RotaryEmbedding``)."""
    rotary = Op(_MICROSOFT, "RotaryEmbedding", _rotary_schema())
    return rotary(x, position_ids, rotary_cos, rotary_sin, interleaved=0, num_heads=heads)


def _cache_attention_to_gqa(query: Any, key: Any, value: Any, past_key: Any, past_value: Any, past_length: Any,
                            mask: Any, scale: float, rotary_cos: Any = None, rotary_sin: Any = None,
                            position_ids: Any = None) -> Any:
    """``hfexport::cache_attention`` as one GroupQueryAttention (plus the layout changes and the bias)."""
    heads, dim = query.shape[1], query.shape[3]
    kv_heads = key.shape[1]
    to_bsh = op.Constant(value_ints=[0, 0, -1])  # [batch, seq, heads * dim] from [batch, seq, heads, dim]
    q = op.Reshape(op.Transpose(query, perm=[0, 2, 1, 3]), to_bsh)
    k = op.Reshape(op.Transpose(key, perm=[0, 2, 1, 3]), to_bsh)
    v = op.Reshape(op.Transpose(value, perm=[0, 2, 1, 3]), to_bsh)
    if rotary_cos is not None:
        q = _rotary(q, rotary_cos, rotary_sin, position_ids, heads)
        k = _rotary(k, rotary_cos, rotary_sin, position_ids, kv_heads)
    # from the mask and past_length alone (not from this layer's tensors): the same nodes in every layer, which the
    # optimizer's common-subexpression elimination then computes once per step
    seq = op.Shape(mask, start=2, end=3)  # int64 [1]
    total = op.Add(op.Reshape(past_length, op.Constant(value_ints=[1])), seq)  # int64 [1]
    seqlens_k = op.Cast(op.Expand(op.Sub(total, op.Constant(value_ints=[1])), op.Shape(mask, start=0, end=1)),
                        to=ir.DataType.INT32)
    total_length = op.Cast(op.Squeeze(total, op.Constant(value_ints=[0])), to=ir.DataType.INT32)
    visible = op.Slice(mask, op.Constant(value_ints=[0]), total, op.Constant(value_ints=[3]))
    zero = op.CastLike(op.Constant(value_float=0.0), query)
    lowest = op.CastLike(op.Constant(value_float=float(torch.finfo(torch.float16).min
                                                       if query.dtype == ir.DataType.FLOAT16
                                                       else torch.finfo(torch.float32).min)), query)
    bias = op.Where(visible, zero, lowest)
    gqa = Op(_MICROSOFT, "GroupQueryAttention", _gqa_schema())
    out, present_key, present_value = gqa(q, k, v, past_key, past_value, seqlens_k, total_length, None, None, None,
                                          bias, num_heads=heads, kv_num_heads=kv_heads, scale=float(scale))
    out = op.Reshape(out, op.Constant(value_ints=[0, 0, heads, dim]))  # [batch, seq, heads, dim]
    return out, present_key, present_value


def lowerings() -> dict[Any, Any]:
    """hfexport's own ops and their ONNX translations, for ``torch.onnx.export``'s ``custom_translation_table``."""
    return {torch.ops.hfexport.cache_attention.default: _cache_attention_to_gqa}
