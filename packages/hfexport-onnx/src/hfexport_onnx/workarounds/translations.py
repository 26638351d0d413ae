"""Stage 4, ONNX translations: ``_aten_*`` functions over onnxscript ops (traced, not scripted), registered as the
``onnx_translation`` kind with their ``target`` op (and ``below_opset`` where torchlib lowers the op better from that
opset on); ``torch.onnx.export`` gets them as its ``custom_translation_table``, ahead of torchlib's functions."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from hfexport.plugin import register_workaround

from .._bitwise import bitshift

__all__: list[str] = []

aten = torch.ops.aten


def _topk_all(self: Any, dim: int, descending: bool) -> Any:
    # TopK(sorted=1) puts the lower index first among equal values: a stable sort, in both directions.
    size = op.Gather(op.Shape(self), op.Constant(value_ints=[dim]), axis=0)
    return op.TopK(self, size, axis=dim, largest=1 if descending else 0, sorted=1)


@register_workaround("onnx_translation", "onnx", target=aten.sort.stable)
def _aten_sort_stable(self: Any, stable: bool | None = None, dim: int = -1, descending: bool = False) -> Any:
    """``aten.sort.stable`` → ``TopK(X, k=size(dim), sorted=1)``, which breaks ties by lower index: a stable sort.

    **Why**: torchlib has no ``sort.stable``: ``torch.sort(x, stable=True)`` and ``torch.argsort(x, stable=True)``
    failed with ``DispatchError: No ONNX function found`` (c21).
    **Upstream**: pytorch/pytorch#95613; fix proposed in microsoft/onnxscript#3053.
    **Remove when**: microsoft/onnxscript#3053 (or an equivalent) is in the minimum onnxscript.
    """
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    values, indices = _topk_all(self, dim, descending)
    return values, indices


@register_workaround("onnx_translation", "onnx", target=aten._is_all_true.default)
def _aten_is_all_true(self: Any) -> Any:
    """``aten._is_all_true`` → ``Cast(ReduceMin(Cast(x, int64)), bool)``: a 0-d bool, true for an empty tensor.

    **Why**: torchlib has no function for it, and torch.export writes it for a ``torch._check`` on a tensor (the
    LLaVA family's image-token check): every such model fed an image failed on ONNX.
    **Upstream**: no entry in torchlib's ATen coverage tracker, microsoft/onnxscript#258.
    **Remove when**: torchlib translates it (the zoo's LLaVA exports with ``disable=("_aten_is_all_true",)``).
    """
    return op.Cast(op.ReduceMin(op.Cast(self, to=ir.DataType.INT64), keepdims=0), to=ir.DataType.BOOL)


@register_workaround("onnx_translation", "onnx", target=aten.searchsorted.Tensor)
def _aten_searchsorted(sorted_sequence: Any, self: Any, *, out_int32: bool = False, right: bool = False,
                       side: str | None = None, sorter: Any = None) -> Any:
    """``aten.searchsorted.Tensor`` → ``ReduceSum(Not(GreaterOrEqual(seq, v)))``: the count of boundaries below ``v``.

    **Why**: torchlib has no function for it (``DispatchError``: s30's packed-sequence ids); ONNX has no SearchSorted.
    **Upstream**: none found (its sibling ``bucketize``: microsoft/onnxscript#1659).
    **Remove when**: torchlib translates it (s30 exports with ``disable=("_aten_searchsorted",)``).
    """
    seq = sorted_sequence if sorter is None else op.GatherElements(sorted_sequence, sorter, axis=-1)
    if len(sorted_sequence.shape) > 1:  # the gathered value has no shape yet
        seq = op.Unsqueeze(seq, op.Constant(value_ints=[-2]))  # [..., 1, M] against [..., K, 1]
    values = op.Unsqueeze(op.CastLike(self, seq), op.Constant(value_ints=[-1]))
    reached = op.Greater(seq, values) if (right or side == "right") else op.GreaterOrEqual(seq, values)
    count = op.ReduceSum(op.Cast(op.Not(reached), to=ir.DataType.INT64), op.Constant(value_ints=[-1]), keepdims=0)
    return op.Cast(count, to=ir.DataType.INT32) if out_int32 else count


_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
_INTS = {ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64, ir.DataType.UINT8}


def _is_integral_value(value: Any) -> bool:
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return False
    return getattr(value, "dtype", None) in _INTS


@register_workaround("onnx_translation", "onnx", target=aten.arange.start_step)
def _aten_arange_float_in_float64(start: Any, end: Any, step: Any = 1, dtype: int = -1, layout: str = "",
                                  device: str = "", pin_memory: bool = False) -> Any:
    """A floating ``aten.arange.start_step`` → ``Cast(Range(start, end, step) in float64, dtype)``, as torch counts it.

    **Why**: torchlib ranges in float32; torch counts in float64: ``arange(1/6, 1.0, 1/6)`` (SmolVLM at 6x6 patches)
    is 6 elements in torch, 5 in float32, and the program failed with ``GatherND ... invalid index ... 5``.
    **Upstream**: none found (torchlib's ``aten_arange_start_step`` ranges in float32; the trigger is transformers'
    ``modeling_smolvlm.py``).
    **Remove when**: ``test_float_arange_counts_as_torch`` passes with ``disable=("_aten_arange_float_in_float64",)``.
    """
    from onnxscript.function_libs.torch_lib.ops.core import aten_arange_start_step

    floating = dtype in _FLOATS if dtype not in (-1, None) else not all(
        _is_integral_value(v) for v in (start, end, step))
    if not floating:
        return aten_arange_start_step(start, end, step, dtype=-1 if dtype is None else dtype)

    def double(value: Any) -> Any:  # a Python scalar as a float64 constant (not via float32), a value cast
        if isinstance(value, bool | int | float):
            return op.Constant(value=ir.tensor(float(value), dtype=ir.DataType.DOUBLE))
        return op.Cast(value, to=ir.DataType.DOUBLE)

    values = op.Range(double(start), double(end), double(step))
    return op.Cast(values, to=ir.DataType.FLOAT if dtype in (-1, None) else dtype)


@register_workaround("onnx_translation", "onnx", target=aten.sym_numel.default)
def _aten_sym_numel(self: Any) -> Any:
    """``aten.sym_numel`` → ``Size(x)``: the element count as a 0-d int64, as torchlib gives ``sym_size.int``.

    **Why**: torchlib has no function for it; it stays for ``numel()`` of a data-dependent size (PaddleOCR-VL's
    image-feature check), so that model fed an image failed on ONNX.
    **Upstream**: no entry in torchlib's ATen coverage tracker, microsoft/onnxscript#258.
    **Remove when**: torchlib translates it (``test_numel_of_paddleocr_vl_image_features_exports`` passes with
    ``disable=("_aten_sym_numel",)``).
    """
    return op.Size(self)


@register_workaround("onnx_translation", "onnx", target=aten.scaled_dot_product_attention.default)
def _aten_scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                       dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                       enable_gqa: bool = False) -> Any:
    """SDPA: torchlib's, a boolean mask made additive, then zeros for query rows that see no key (as eager).

    **Why**: torchlib fills a boolean mask with the finite ``dtype.min``: a fully masked row gets the mean of ``v``
    (c03: 0.93 from eager; left-padded Llama/GPT-2: 0.05-0.13), an all ``-inf`` additive row gets NaN (s03).
    **Upstream**: microsoft/onnxscript#2479, pytorch/pytorch#159973, pytorch/pytorch#103749, onnx/onnx#8068.
    **Remove when**: torchlib's SDPA zeroes fully masked rows for both mask kinds (re-run c03 and s03).
    """
    from onnxscript.function_libs.torch_lib.ops.nn import aten_scaled_dot_product_attention as torchlib_sdpa

    if attn_mask is None:
        return torchlib_sdpa(query, key, value, None, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                             enable_gqa=enable_gqa)
    if attn_mask.dtype == ir.DataType.BOOL:
        visible = attn_mask
        # As an additive mask (0 / -inf, [..., L, S]): torchlib's boolean path masks the [batch, heads, L, S]
        # scores with Where and guards the softmax with IsNaN + Where, three passes over the largest tensor of
        # the layer; the additive path is one Add. Fully masked rows become NaN there and are zeroed below.
        attn_mask = op.Where(attn_mask, op.CastLike(op.Constant(value_float=0.0), query),
                             op.CastLike(op.Constant(value_float=float("-inf")), query))
    else:
        visible = op.Not(op.IsInf(attn_mask, detect_negative=1, detect_positive=0))
    out = torchlib_sdpa(query, key, value, attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
    # True where the query row sees at least one key; [..., L, 1] broadcasts against the output [..., L, Ev].
    sees_any = op.Cast(op.ReduceMax(op.Cast(visible, to=ir.DataType.INT32), op.Constant(value_ints=[-1]),
                                    keepdims=1), to=ir.DataType.BOOL)
    return op.Where(sees_any, out, op.CastLike(op.Constant(value_float=0.0), out))


@register_workaround("onnx_translation", "onnx", target=aten.gelu.default, below_opset=20)
def _aten_gelu(self: Any, approximate: str = "none") -> Any:
    """``aten.gelu(x)`` below opset 20 → ``0.5 * (x * (Erf(x / sqrt(2)) + 1))``, the order ORT fuses to ``Gelu``.

    **Why**: torchlib's ``x * (0.5 * (1 + Erf(...)))`` is fused by neither: five element-wise kernels per BERT MLP,
    about 8% of all-MiniLM-L6-v2's CPU time at batch 8 (same formula, equal within rounding).
    **Upstream**: microsoft/onnxscript#2132, microsoft/onnxscript#2495, microsoft/onnxruntime#3148.
    **Remove when**: torchlib's opset-18 gelu uses a fusable order, or the default opset is 20 or higher.
    """
    from onnxscript.function_libs.torch_lib.ops.nn import aten_gelu as torchlib_gelu

    if approximate != "none":
        return torchlib_gelu(self, approximate=approximate)
    erf = op.Erf(op.Div(self, op.CastLike(op.Constant(value_float=1.4142135623730951), self)))
    x_erf = op.Mul(self, op.Add(erf, op.CastLike(op.Constant(value_float=1.0), self)))
    return op.Mul(op.CastLike(op.Constant(value_float=0.5), self), x_erf)


@register_workaround("onnx_translation", "onnx", target=aten.masked_select.default)
def _aten_masked_select(self: Any, mask: Any) -> Any:
    """``aten.masked_select(x, mask)`` → ``Compress`` of both, broadcast and flattened (row-major, as eager).

    **Why**: torchlib's ``aten_masked_select`` raises ``NotImplementedError`` and no decomposition applies (e10, s52).
    **Upstream**: microsoft/onnxscript#1675 (closed; torchlib 0.7.2 still raises).
    **Remove when**: torchlib implements it (e10 exports with ``disable=("_aten_masked_select",)``).
    """
    values = op.Expand(self, op.Shape(mask))
    keep = op.Expand(mask, op.Shape(values))
    flat = op.Constant(value_ints=[-1])
    return op.Compress(op.Reshape(values, flat), op.Reshape(keep, flat), axis=0)


@register_workaround("onnx_translation", "onnx", target=aten.bitwise_right_shift.Tensor)
def _aten_bitwise_right_shift(self: Any, other: Any) -> Any:
    """``aten.bitwise_right_shift.Tensor`` → ``BitShift(x, k, "RIGHT")`` for unsigned dtypes, torchlib's for signed.

    **Why**: torchlib returns the signed type: ``uint8 >> 4`` came back int8 (s50), and s51's ``& 3`` then failed
    at session creation (``int8 != uint8``); GPTQ/AWQ-style packed weights (e06) are uint8.
    **Upstream**: none found for the result type (torchlib ``aten_bitwise_right_shift``; microsoft/onnxscript#258).
    **Remove when**: torchlib keeps unsigned dtypes (s50 exports with both shift translations disabled).
    """
    return bitshift(self, other, "RIGHT")


@register_workaround("onnx_translation", "onnx", target=aten.bitwise_left_shift.Tensor)
def _aten_bitwise_left_shift(self: Any, other: Any) -> Any:
    """``aten.bitwise_left_shift.Tensor`` → ``BitShift(x, k, "LEFT")`` keeping unsigned dtypes (wraps as eager).

    **Why**: as ``_aten_bitwise_right_shift``: torchlib returns int8 for ``uint8 << 4``.
    **Upstream**: none found (torchlib ``aten_bitwise_left_shift``; tracker microsoft/onnxscript#258).
    **Remove when**: torchlib keeps unsigned dtypes in its shifts.
    """
    return bitshift(self, other, "LEFT")
