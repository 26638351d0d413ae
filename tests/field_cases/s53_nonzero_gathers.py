"""S53 (sibling of e10, data-dependent output sizes on ONNX): ``nonzero``-based gathers: ``torch.where(cond)`` as
a tuple of index vectors used to gather (``x[torch.where(cond)]``), ``argwhere`` of a 2-D mask and
``index_select`` by the positions of the kept columns. The mask is an input; the number of hits differs between
the two runs (11 and 3 in the first map, 0 columns kept in neither).
"""
import torch


class Gathers(torch.nn.Module):
    def forward(self, x, cond):
        rows, cols = torch.where(cond)
        picked = x[rows, cols] + rows.to(x.dtype)
        where = torch.argwhere(cond)
        kept_cols = torch.nonzero(cond.any(0)).squeeze(-1)
        return picked, where, torch.index_select(x, 1, kept_cols) * 3.0


def _case(seed, p):
    g = torch.Generator().manual_seed(seed)
    inputs = {"x": torch.randn(4, 6, generator=g), "cond": torch.rand(4, 6, generator=g) < p}
    with torch.no_grad():
        return inputs, Gathers()(**inputs)


def build():
    return (Gathers().eval(), *_case(0, 0.45))


def ALT_INPUTS():
    return _case(1, 0.12)
