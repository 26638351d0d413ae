"""Tensor-level rewrites that the ExecuTorch workarounds trace instead of ops the runtime cannot run as they are.

Each of ``ET_DECOMPOSITIONS`` is built from ops with portable kernels; the workaround that uses it (in
``workarounds/executorch_patches.py``) says why. ``XNNPACK_DECOMPOSITIONS`` express ops that XNNPACK's partitioner does not
take with ops that it does, so that they run inside the delegate (``prepare_for_xnnpack`` adds them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from ._delegation import rejected_by_edge

__all__ = ["ET_DECOMPOSITIONS", "XNNPACK_DECOMPOSITIONS", "count_below", "decompose_in_branches",
           "is_control_flow", "layer_norm_delegable", "nonzero_row_major",
           "rejected_ops_with_decomposition", "sdpa_delegable", "sort_pairwise", "unsupported_op_message"]

aten = torch.ops.aten


def nonzero_row_major(input: torch.Tensor) -> torch.Tensor:
    """``torch.nonzero(input)`` built from a boolean index of ``arange`` (row-major ``[nnz, dim]``, contiguous)."""
    flat = input.reshape(-1) != 0
    positions = torch.arange(flat.shape[0], device=input.device)[flat]  # [nnz], in row-major order
    coords = []
    for size in reversed(input.shape):
        coords.append(positions % size)
        positions = torch.div(positions, size, rounding_mode="floor")
    return torch.stack(coords[::-1], dim=1)


def sort_pairwise(x: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A stable sort from comparisons only: ``rank[i] = #{j: x_j before x_i} + #{j < i: x_j == x_i}``.

    Uses lt/gt/eq/logical ops/sum/gather (all with portable kernels). NaN sorts last ascending and first
    descending, as in eager. Memory is O(n^2) along ``dim`` (fine for token ranking and routing; not for n=32k).
    """
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.long)
    dim = dim % x.dim()
    xt = x.movedim(dim, -1)
    n = xt.shape[-1]
    xi, xj = xt.unsqueeze(-1), xt.unsqueeze(-2)  # [..., n(i), 1], [..., 1, n(j)]
    if x.is_floating_point():
        nan_i, nan_j = torch.isnan(xi), torch.isnan(xj)
        bigger_j = (xj > xi) | (nan_j & ~nan_i)  # NaN is the largest value
        smaller_j = (xj < xi) | (nan_i & ~nan_j)
        equal = (xj == xi) | (nan_i & nan_j)
    else:
        bigger_j, smaller_j, equal = xj > xi, xj < xi, xj == xi
    before = bigger_j if descending else smaller_j
    positions = torch.arange(n, device=x.device)
    earlier = positions.unsqueeze(-1) > positions.unsqueeze(0)  # [i, j]: j < i
    rank = (before | (equal & earlier)).sum(-1)  # [..., n]: where element i goes
    onehot = rank.unsqueeze(-1) == positions  # [..., i, r]
    index = (onehot.long() * positions.unsqueeze(-1)).sum(-2)  # [..., r]: which i lands at r
    return torch.gather(xt, -1, index).movedim(-1, dim), index.movedim(-1, dim)


def _decompose_sort_stable(x: torch.Tensor, *, stable: bool | None = None, dim: int = -1,
                           descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return sort_pairwise(x, dim, descending)


def _decompose_sort(x: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return sort_pairwise(x, dim, descending)


def count_below(sorted_sequence: torch.Tensor, values: torch.Tensor, right: bool = False,
                out_int32: bool = False) -> torch.Tensor:
    """``searchsorted``/``bucketize`` as a comparison and a sum: ``#{j: not (s_j >= v)}`` (``>`` when ``right``).

    ``sorted_sequence`` is 1-D or has the leading dims of ``values``; the last dim is searched. Counting the
    boundaries that do *not* reach ``v`` gives eager's answer for NaN too (``len(sequence)``). Uses only
    comparisons, ``logical_not`` and ``sum`` (portable kernels; no data-dependent loop, so the boundary count may
    be dynamic). Memory is O(len(values) * len(sequence)).
    """
    if sorted_sequence.dim() == 1:
        seq = sorted_sequence.reshape((1,) * values.dim() + sorted_sequence.shape)  # [1.., M]
        vals = values.unsqueeze(-1)  # [..., 1]
    else:
        seq, vals = sorted_sequence.unsqueeze(-2), values.unsqueeze(-1)  # [..., 1, M], [..., K, 1]
    reached = (seq > vals) if right else (seq >= vals)
    return torch.logical_not(reached).sum(-1).to(torch.int32 if out_int32 else torch.int64)


def _decompose_bucketize(input: Any, boundaries: torch.Tensor, *, out_int32: bool = False,
                         right: bool = False) -> torch.Tensor:
    values = input if isinstance(input, torch.Tensor) else torch.scalar_tensor(input, dtype=boundaries.dtype)
    return count_below(boundaries, values, right, out_int32)


def _decompose_searchsorted(sorted_sequence: torch.Tensor, input: Any, *, out_int32: bool = False,
                            right: bool = False, side: str | None = None,
                            sorter: torch.Tensor | None = None) -> torch.Tensor:
    if sorter is not None:
        sorted_sequence = torch.gather(sorted_sequence, -1, sorter)
    values = input if isinstance(input, torch.Tensor) else torch.scalar_tensor(input, dtype=sorted_sequence.dtype)
    return count_below(sorted_sequence, values, right or side == "right", out_int32)


def _decompose_is_all_true(input: torch.Tensor) -> torch.Tensor:
    """``aten._is_all_true(input)`` (a 0-dim bool: every element true) as ``not any(not input)``.

    ``torch._check(t.all())`` on a tensor traces to it (the LLaVA family checks its image tokens so); it is not
    Core ATen and has no portable kernel, while ``logical_not`` and ``any`` are and have
    (microsoft/onnxscript#258 tracks the same op for ONNX).
    """
    return torch.logical_not(torch.any(torch.logical_not(input)))


def _decompose_unique_consecutive(input: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                                  dim: int | None = None) -> Any:
    """``aten.unique_consecutive`` of a 1-D tensor (``dim`` None) from comparisons, a cumulative sum and a boolean
    index: an element is kept where it differs from its predecessor. Same values, order and dtypes as eager's
    ``(output, inverse, counts)``; an output not asked for is an empty int64 tensor, as eager's.

    Not Core ATen and no portable kernel; Qwen2.5-VL-style vision windows (``transformers/vision_utils.py`` drops
    repeated window boundaries with it) reach it: EXAONE 4.5 with its image. The predecessor is gathered at
    ``max(i - 1, 0)`` rather than sliced, because the input's length is often unbacked (a slice's fake kernel
    guards on it). ``counts`` compares each element's segment with every segment: O(n * segments) memory.
    Another ``dim`` or rank: ``NotImplemented`` (the op stays, and the edge verifier names it).
    """
    if dim is not None or input.dim() != 1:
        return NotImplemented
    positions = torch.arange(input.shape[0], device=input.device)
    previous = torch.index_select(input, 0, torch.clamp(positions - 1, min=0))
    starts = (input != previous) | (positions == 0)
    output = input[starts]  # a new unbacked length, planned by _patch_unbacked_size_upper_bound
    empty = torch.zeros(0, dtype=torch.long, device=input.device)
    inverse = torch.cumsum(starts.to(torch.long), 0) - 1
    counts = empty
    if return_counts:
        segments = torch.arange(output.shape[0], device=input.device)
        counts = (inverse[None, :] == segments[:, None]).sum(-1)
    return output, inverse if return_inverse else empty, counts


def _decompose_embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                             scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                             per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                             padding_idx: int = -1) -> Any:
    """``aten._embedding_bag`` in ``sum`` (0) and ``mean`` (1) modes as a row gather and a ``scatter_add`` into
    the bags: each index's bag is the number of offsets at or before its position, minus one.

    Core ATen, but no portable kernel in executorch 1.5.1. Kimi-K2.5's vision tower resamples its position grid
    bicubically with ``F.embedding_bag(..., per_sample_weights=..., mode="sum")``. Memory is linear in the
    indices. The other three outputs (used only by the backward) are the CPU kernel's: for ``sum`` an empty
    ``offset2bag`` and zero ``bag_size``/``max_indices``, for ``mean`` the bag of each index and each bag's size
    (twice). ``max`` mode or a ``padding_idx``: ``NotImplemented`` (the op stays, and the kernel check names it).
    """
    if mode not in (0, 1) or (padding_idx is not None and padding_idx >= 0) or indices.dim() != 1:
        return NotImplemented
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    positions = torch.arange(indices.shape[0], device=indices.device)
    bag_of = count_below(offsets[:bags], positions, right=True) - 1  # [n]: the bag each index falls in
    rows = torch.index_select(weight, 0, indices)  # [n, D]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(-1).to(rows.dtype)
    total = torch.zeros(bags, weight.shape[1], dtype=weight.dtype, device=weight.device)
    total = torch.scatter_add(total, 0, bag_of.unsqueeze(-1).expand(rows.shape), rows)
    if mode == 0:
        zeros = torch.zeros(bags, dtype=torch.long, device=indices.device)
        return total, torch.zeros(0, dtype=torch.long, device=indices.device), zeros, zeros.clone()
    sizes = torch.scatter_add(torch.zeros(bags, dtype=torch.long, device=indices.device), 0, bag_of,
                              torch.ones_like(bag_of))  # [bags]
    mean = total / torch.clamp(sizes, min=1).unsqueeze(-1).to(total.dtype)
    return mean, bag_of, sizes, sizes.clone()


def _antialiased_cubic_weights(in_size: int, out_size: int, align_corners: bool, scale: float | None,
                               dtype: torch.dtype, device: Any) -> torch.Tensor:
    """The ``[out_size, in_size]`` matrix of antialiased bicubic interpolation along one dim, as ATen's CPU kernel
    computes it (``UpSampleKernel.cpp``'s ``_compute_weights_aa`` with its ``aa_filter``, Keys' cubic with
    ``a = -0.5``, PIL's): output ``i`` centred at ``s * (i + 0.5)``, a support of ``2 * max(s, 1)`` input
    pixels, the cubic stretched by ``max(s, 1)``, each row normalized to sum 1; ``s`` the input/output ratio (or
    ``1 / scale`` when given, ``(in - 1) / (out - 1)`` with ``align_corners``). Built from ``arange`` and
    elementwise ops (a tensor literal would not trace functionally inside a decomposition)."""
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    support, stretch = (2.0 * ratio, 1.0 / ratio) if ratio >= 1.0 else (2.0, 1.0)
    center = (torch.arange(out_size, device=device, dtype=dtype) + 0.5).unsqueeze(-1) * ratio  # [out, 1]
    inputs = torch.arange(in_size, device=device, dtype=dtype).unsqueeze(0)  # [1, in]
    first = torch.clamp(torch.floor(center - support + 0.5), min=0)  # ATen truncates; equal once clamped at 0
    end = torch.clamp(torch.floor(center + support + 0.5), max=in_size)
    x = torch.abs((inputs - center + 0.5) * stretch)
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    weights = torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))
    weights = torch.where((inputs >= first) & (inputs < end), weights, torch.zeros_like(weights))
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total == 0, torch.ones_like(total), total)


def _decompose_upsample_bicubic2d_aa(input: torch.Tensor, output_size: Any, align_corners: bool,
                                     scales_h: float | None = None, scales_w: float | None = None) -> Any:
    """``aten._upsample_bicubic2d_aa`` (``F.interpolate(mode="bicubic", antialias=True)``) of static sizes as two
    matrix products with the interpolation matrices ``[out_h, in_h] @ x @ [in_w, out_w]``.

    Not Core ATen, no decomposition in ``torch._decomp`` (only of ``.vec`` into it), no portable kernel;
    Unlimited-OCR resizes its vision position embeddings so. Within 2.4e-6 of eager's float32 (the kernel sums
    in another order). A dynamic size: ``NotImplemented`` (the op stays, and the edge verifier names it).
    """
    sizes = (*input.shape[-2:], *output_size)
    if not all(isinstance(size, int) for size in sizes) or input.dim() != 4:
        return NotImplemented
    in_h, in_w, out_h, out_w = sizes
    rows = _antialiased_cubic_weights(in_h, out_h, align_corners, scales_h, input.dtype, input.device)
    columns = _antialiased_cubic_weights(in_w, out_w, align_corners, scales_w, input.dtype, input.device)
    return torch.matmul(torch.matmul(rows, input), columns.t())


def _scalar_as_tensor(scalar: Any, like: torch.Tensor) -> torch.Tensor:
    """``scalar`` as a tensor of the dtype eager gives ``scalar <op> like`` (a Python int keeps ``like``'s dtype)."""
    dtype = torch.result_type(scalar, like)
    return torch.scalar_tensor(scalar, dtype=dtype, device=like.device)


def _bitwise_decompositions() -> dict[Any, Callable[..., Any]]:
    """Every spelling of a shift or a bitwise op on integer tensors, as the overload the runtime has a kernel for.

    ``x >> k`` and ``x << k`` trace to ``aten.__rshift__``/``aten.__lshift__`` (``.Scalar``, ``.Tensor``):
    not Core ATen, no decomposition in ``torch._decomp``, no portable kernel, while
    ``bitwise_right_shift``/``bitwise_left_shift`` (``.Tensor``, ``.Tensor_Scalar``) have portable kernels (they
    are admitted by ``_patch_aten_dialect_verifier``). ``__and__``/``__or__``/``__xor__`` become the Core ATen
    ``bitwise_and``/``or``/``xor``. A scalar on the left (``1 << t``: ``.Scalar_Tensor``, no kernel) becomes a
    0-d tensor of eager's result dtype. Same semantics as eager's: ``>>`` is arithmetic on signed integers, the
    result dtype follows the usual promotion.
    """
    table: dict[Any, Callable[..., Any]] = {}
    shifts = {"rshift": aten.bitwise_right_shift, "lshift": aten.bitwise_left_shift}
    for name, target in shifts.items():
        dunder = getattr(aten, f"__{name}__")
        table[dunder.Scalar] = target.Tensor_Scalar
        table[dunder.Tensor] = target.Tensor
        table[target.Scalar_Tensor] = functools.partial(
            lambda target, scalar, other: target.Tensor(_scalar_as_tensor(scalar, other), other), target)
    for name in ("and", "or", "xor"):
        dunder, target = getattr(aten, f"__{name}__"), getattr(aten, f"bitwise_{name}")
        table[dunder.Scalar] = target.Scalar
        table[dunder.Tensor] = target.Tensor
        table[target.Scalar_Tensor] = functools.partial(
            lambda target, scalar, other: target.Tensor(_scalar_as_tensor(scalar, other), other), target)
    return table


# Decompositions we own, for ops that neither Core ATen decompositions nor portable kernels cover.
ET_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    **_bitwise_decompositions(),  # every shift and bitwise spelling (e06: int4 unpacked with >> and &)
    aten.sort.stable: _decompose_sort_stable,  # not Core ATen, no portable kernel
    aten.sort.default: _decompose_sort,  # Core ATen, but no portable kernel in executorch 1.5.1
    # not Core ATen, no portable kernel; torch._decomp's bucketize guards on log2(len(boundaries)) and has no
    # searchsorted at all
    aten.bucketize.Tensor: _decompose_bucketize,
    aten.bucketize.Scalar: _decompose_bucketize,
    aten.searchsorted.Tensor: _decompose_searchsorted,
    aten.searchsorted.Scalar: _decompose_searchsorted,
    aten._is_all_true.default: _decompose_is_all_true,  # not Core ATen, no portable kernel
    aten.unique_consecutive.default: _decompose_unique_consecutive,  # not Core ATen, no portable kernel
    aten._embedding_bag.default: _decompose_embedding_bag,  # Core ATen, but no portable kernel
    aten._upsample_bicubic2d_aa.default: _decompose_upsample_bicubic2d_aa,  # not Core ATen, no portable kernel
}


# ── ops inside the branches and bodies of higher-order ops (torch.cond, while_loop, map, scan) ────────────
_CONTROL_FLOW = ("cond", "while_loop", "map_impl", "scan", "associative_scan")


def _linear_as_matmul(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.matmul(input, weight.t())
    return out if bias is None else out + bias


def _prelu_as_where(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    slope = weight if weight.numel() == 1 or input.dim() < 2 else weight.reshape(-1, *([1] * (input.dim() - 2)))
    return torch.where(input > 0, input, input * slope)


def _max_pool2d_with_indices(input: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                             dilation: Any = 1, ceil_mode: bool = False) -> torch.Tensor:
    return aten.max_pool2d_with_indices.default(input, kernel_size, stride, padding, dilation, ceil_mode)[0]


# Decompositions of non-Core-ATen ops that partitioners keep whole (``ops_to_not_decompose``: XNNPACK's linear,
# prelu, max_pool2d, hardswish, upsample_bilinear2d) where torch's table has none at the aten level (its
# ``op.decompose`` returns NotImplemented inside a branch's re-trace; its ``prelu`` emits ``prims`` ops).
_BRANCH_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.linear.default: _linear_as_matmul,
    aten.prelu.default: _prelu_as_where,
    aten.max_pool2d.default: _max_pool2d_with_indices,
}


@functools.cache
def _decomposed_call(op: Any) -> Callable[..., Any] | None:
    """A plain function that computes ``op`` from other ops (traced through by ``to_edge``'s re-trace), or None."""
    from torch._decomp import decomposition_table

    fn = _BRANCH_DECOMPOSITIONS.get(op) or decomposition_table.get(op)
    if fn is None or getattr(fn, "__module__", "").startswith("torch._refs"):  # prims ops: not for the edge dialect
        return None

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"decomposed_{op._schema.name.split('::')[-1]}_{op._overloadname}"
    return call


def is_control_flow(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls a higher-order op with graph arguments (``torch.cond``, ``while_loop``, ...)."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)
            and node.target.name() in _CONTROL_FLOW)


def decompose_in_branches(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[str]:
    """Makes every non-Core-ATen aten op inside the branches (bodies) of the higher-order op ``node`` a call of its
    decomposition (nested ones too), so that ``to_edge``'s re-trace decomposes it; returns the ops rewritten.

    ``to_edge_transform_and_lower`` leaves out of its decomposition table the ops a partitioner keeps whole
    (XNNPACK's ``linear``, ``hardswish``, ``prelu``, ...), but partitioners do not reach into the branches of a
    ``torch.cond``: such an op in a branch is then neither decomposed nor delegated.
    """
    done: list[str] = []
    for arg in node.args:
        if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
            continue
        branch = getattr(gm, str(arg.target), None)
        if not isinstance(branch, torch.fx.GraphModule):
            continue
        for inner in list(branch.graph.nodes):
            target = inner.target
            if is_control_flow(inner):
                done += decompose_in_branches(branch, inner)
            elif (inner.op == "call_function" and isinstance(target, torch._ops.OpOverload)
                  and target.namespace == "aten" and torch.Tag.core not in target.tags):
                call = _decomposed_call(target)
                if call is not None:
                    inner.target = call
                    done.append(str(target))
        branch.recompile()
    return done


# ── XNNPACK: ops its partitioner does not take, as ops it does ─────────────────────────────────────────
def layer_norm_delegable(input: torch.Tensor, normalized_shape: Any, weight: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None, eps: float = 1e-5) -> Any:
    """``aten.native_layer_norm`` over the last dim of a 3-D float32 tensor, from ops XNNPACK delegates.

    ``x [b, s, h]`` is viewed as ``[b, s, h, 1]`` so that both means are XNNPACK's ``mean.dim`` over dims
    ``(2, 3)`` (its only form: 4-D, innermost dims, keepdim); then ``sub``, ``mul``, ``add``, ``rsqrt`` and a
    view back. Two-pass variance (mean of the squared deviations), as eager. Returns ``(out [b, s, h],
    mean [b, s, 1], rstd [b, s, 1])``; other ranks, dtypes and normalized shapes return ``NotImplemented``
    (the op is kept whole: a portable kernel), and so does an input with more than one dynamic dim: XNNPACK's
    partitioner takes its ``unsqueeze_copy`` and then fails to serialize it ("XNNPACK reshape only supports 1
    dynamic dimension", executorch 1.5.1 ``op_squeeze.py``; ``UnsqueezeCopyConfig`` does not check it).
    """
    if input.dim() != 3 or len(normalized_shape) != 1 or input.dtype != torch.float32 \
            or sum(not isinstance(size, int) for size in input.shape) > 1:
        return NotImplemented
    # eager's kernel returns a contiguous tensor whatever the input's strides; elementwise ops keep a transposed
    # input's layout instead, and a later view of the output, traced as contiguous, then fails to re-trace
    x = input.contiguous().unsqueeze(-1)  # [b, s, h, 1]
    mean = x.mean(dim=[2, 3], keepdim=True)  # [b, s, 1, 1]
    centered = x - mean
    rstd = torch.rsqrt((centered * centered).mean(dim=[2, 3], keepdim=True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight.unsqueeze(-1)
    if bias is not None:
        out = out + bias.unsqueeze(-1)
    stats = (*input.shape[:2], 1)
    return out.view(input.shape), mean.view(stats), rstd.view(stats)


def sdpa_delegable(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> torch.Tensor:
    """``aten.scaled_dot_product_attention`` as ``bmm``, ``add``, ``_softmax`` and ``mul`` (all delegated).

    ``q [B, H, L, E]``, ``k [B, H, S, E]``, ``v [B, H, S, Ev]`` float32 -> ``[B, H, L, Ev]``. The scale goes into
    ``q`` as a tensor constant (a ``mul.Scalar`` would stay outside the delegate), the products are ``bmm`` of
    ``[B*H, ...]`` views (no ``expand_copy``). A boolean mask becomes an additive one (0 where kept, the dtype's
    lowest finite value where masked) and an attention mask of any dtype gives a row factor: 0 where a query row
    masks every key, as eager's safe softmax gives (an all ``-inf`` row would be NaN). Those two are small
    portable ops on the mask ``[b, 1, L, S]``; CSE shares them between layers. Dropout, ``is_causal``, grouped
    heads and other dtypes keep torch's decomposition (``_scaled_dot_product_attention_math``, which adds the mask
    it gets: a boolean mask is made additive for it first, as ``F.scaled_dot_product_attention`` does).
    """
    if (dropout_p != 0.0 or is_causal or query.dim() != 4 or key.dim() != 4 or value.dim() != 4
            or query.dtype != torch.float32 or key.shape[1] != query.shape[1] or value.shape[1] != query.shape[1]
            or not isinstance(query.shape[-1], int)):
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # The math op adds its mask: a boolean one must be made additive first, as the public op does
            # (added as 0/1, it gave Falcon's multi-query heads a max abs diff of 2.5 on executorch-xnnpack).
            attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
        return aten._scaled_dot_product_attention_math.default(  # torch's own path (not .decompose(): recursion)
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    batch, heads, length, dim = query.shape
    keys, dim_v = key.shape[-2], value.shape[-1]
    factor = 1.0 / math.sqrt(dim) if scale is None else scale
    q = (query * factor).reshape(batch * heads, length, dim)
    k = key.reshape(batch * heads, keys, dim).transpose(1, 2)
    scores = torch.bmm(q, k).view(batch, heads, length, keys)
    keep = None
    if attn_mask is not None:
        lowest = torch.finfo(query.dtype).min
        if attn_mask.dtype == torch.bool:
            keep = attn_mask.any(dim=-1, keepdim=True)
            additive = torch.where(attn_mask, 0.0, lowest).to(query.dtype)
        else:
            keep = (attn_mask != float("-inf")).any(dim=-1, keepdim=True)
            additive = attn_mask.clamp(min=lowest)
        scores = scores + additive
    probs = torch.softmax(scores, dim=-1).view(batch * heads, length, keys)
    out = torch.bmm(probs, value.reshape(batch * heads, keys, dim_v)).view(batch, heads, length, dim_v)
    if keep is not None:
        out = out * torch.where(keep, 1.0, 0.0).to(query.dtype)
    return out


# XNNPACK in executorch 1.5.1 has no partitioner config for layer norm, and torch's SDPA decomposition emits
# ``mul.Scalar``, same-shape ``expand_copy`` and a boolean safe softmax (eq/logical_not/any/where) per layer, none
# of which XNNPACK takes: all-MiniLM-L6-v2 ran 38% of its compute nodes on portable kernels (a copy in and out
# of the delegate for each).
XNNPACK_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.native_layer_norm.default: layer_norm_delegable,
    aten.scaled_dot_product_attention.default: sdpa_delegable,
}


def unsupported_op_message(op: Any) -> str:
    """The error for a non-Core-ATen op with neither a decomposition nor a portable kernel: the op, and what to do."""
    return (f"{op} is not in Core ATen, has no decomposition into Core ATen (torch._decomp, or hfexport's "
            "ET_DECOMPOSITIONS in hfexport_executorch/_decompositions.py) and no kernel in the ExecuTorch portable "
            "library, so no ExecuTorch program can run it. Rewrite that step of the model with Core ATen ops "
            "(comparisons, sum, gather, where, ...), add a decomposition of the op to ET_DECOMPOSITIONS, or "
            "register an @register_patch('executorch', ...) that traces something else; or export it with "
            "backend='onnx' or 'dynamo'")


@functools.cache
def rejected_ops_with_decomposition() -> dict[Any, Callable[..., Any]]:
    """``torch._decomp.decomposition_table`` entries for the aten ops the edge verifier rejects.

    Only the aten-level ones (``torch._decomp.decompositions``): the ``torch._refs`` entries (``copysign``,
    ``cumprod``, ...) emit ``prims.*`` ops that neither the edge dialect nor XNNPACK take (``prims.abs.default is
    not supported in XNNPACK Delegate``); ops we need from there get a decomposition of our own in
    ``ET_DECOMPOSITIONS`` (``bucketize``).
    """
    from torch._decomp import decomposition_table

    return {op: fn for op, fn in decomposition_table.items()
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and rejected_by_edge(op)
            and not getattr(fn, "__module__", "").startswith("torch._refs")}
