"""FX node fixes that keep XNNPACK's partitions whole: ops XNNPACK runs, written in the form its partitioner accepts,
so that a decoder layer is not cut into several delegates around a portable kernel.

Each is a registered node fix of the ``"executorch.xnnpack"`` scope (``disable=("<name>",)`` leaves it out), with a
test in ``tests/executorch/test_xnnpack_partitions.py``.
"""

from __future__ import annotations

import torch

from hfexport.plugin import register_fx_node_fix

from ._graph import emit

__all__: list[str] = []


def _last_dim_mean(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input of ``aten.mean.dim(x, [-1], keepdim=True)`` over a rank-3 float ``x`` with at most one symbolic
    size, else None."""
    if node.op != "call_function" or node.target is not torch.ops.aten.mean.dim or node.kwargs.get("dtype"):
        return None
    source = node.args[0]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not keepdim or not isinstance(value, torch.Tensor) or value.dim() != 3 or not value.dtype.is_floating_point:
        return None
    dims = node.args[1]
    if not isinstance(dims, list | tuple) or len(dims) != 1 or dims[0] not in (-1, 2):
        return None
    if sum(not isinstance(size, int) for size in value.shape) > 1 or not isinstance(value.shape[2], int):
        return None
    return source


@register_fx_node_fix("executorch.xnnpack")
def _fix_last_dim_mean_as_average_pooling(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``x.mean(-1, keepdim=True)`` of a rank-3 ``x`` (RMSNorm's variance) as XNNPACK's global average pooling:
    ``x.unsqueeze(-1)`` is ``[b, s, h, 1]``, its mean over dims ``[2, 3]`` (keepdim) is ``[b, s, 1, 1]``, reshaped to
    ``[b, s, 1]`` with the one symbolic size written ``-1``.

    **Why**: XNNPACK's partitioner takes ``mean.dim`` only over the two innermost dims of a 4-D tensor with
    ``keepdim=True`` (``MeanDimConfig``: it lowers to global average pooling), so the rank-3 mean of every
    RMSNorm runs on the portable kernel and cuts the layer's XNNPACK partition in two. The seeded Qwen2-0.5B-shaped
    decoder had 123 XNNPACK partitions (about five per layer, two of them around its norms' means); each is a
    delegate call per decode step and 17 re-traces in ``preprocess`` at export. XNNPACK's ``unsqueeze_copy`` (on the
    trailing dim) and ``view_copy`` (static sizes, one ``-1``) keep the rewritten ops in the partition, so it applies
    only where the input has at most one symbolic size (a decoder exported for ``max_batch=1``: ``[1, s, h]``).
    **Upstream**: pytorch/executorch#19206 (``MeanDimConfig``'s constraints: 4-D, innermost two dims, keepdim);
    no issue found for a mean over the last dim of a 3-D tensor.
    **Remove when**: XNNPACK's partitioner takes ``mean.dim`` over the last dim of a 3-D tensor (the test's RMSNorm
    then lowers to one partition with this fix disabled).
    """
    source = _last_dim_mean(node)
    if source is None:
        return False
    shape = [size if isinstance(size, int) else -1 for size in source.meta["val"].shape[:2]] + [1]
    with gm.graph.inserting_before(node):
        pooled_input = emit(gm, node, torch.ops.aten.unsqueeze.default, source, -1)
        pooled = emit(gm, node, torch.ops.aten.mean.dim, pooled_input, [2, 3], True)
        reshaped = emit(gm, node, torch.ops.aten.view.default, pooled, shape)
    node.replace_all_uses_with(reshaped)
    gm.graph.erase_node(node)
    return True
