"""Tensor-level rewrites that the ExecuTorch workarounds trace instead of ops the runtime cannot run as they are.

Each is built from ops with portable kernels; the workaround that uses it (in ``exporter_executorch.py``) says
why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ._delegation import rejected_by_edge

__all__ = ["ET_DECOMPOSITIONS", "nonzero_row_major", "rejected_ops_with_decomposition", "sort_pairwise"]

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


# Decompositions we own, for ops that neither Core ATen decompositions nor portable kernels cover.
ET_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.sort.stable: _decompose_sort_stable,  # not Core ATen, no portable kernel
    aten.sort.default: _decompose_sort,  # Core ATen, but no portable kernel in executorch 1.5.1
}


@functools.cache
def rejected_ops_with_decomposition() -> dict[Any, Callable[..., Any]]:
    """``torch._decomp.decomposition_table`` entries for the aten ops the edge verifier rejects."""
    from torch._decomp import decomposition_table

    return {op: fn for op, fn in decomposition_table.items()
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and rejected_by_edge(op)}
