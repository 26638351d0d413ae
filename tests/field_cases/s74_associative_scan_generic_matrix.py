"""S74 (sibling of f03): `associative_scan` with `combine_mode="generic"` and a combine that is not pointwise: the
affine recurrence `h_t = A_t h_{t-1} + b_t` with a 3x3 matrix per step, composed as `(A_r @ A_l, A_r @ b_l + b_r)`;
the scanned axis is 1 of `[batch, time, ...]`, batch and time dynamic.

Expected: eager output (2, 7, 3), and from the same program at batch 3, time 12.
"""
import torch
from torch._higher_order_ops.associative_scan import associative_scan
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=1, max=8), 1: Dim("time", min=2, max=64)}}


def _compose(left, right):
    a_l, b_l = left
    a_r, b_r = right
    return a_r @ a_l, (a_r @ b_l.unsqueeze(-1)).squeeze(-1) + b_r


class MatrixRecurrence(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.to_a = torch.nn.Linear(4, 9)
        self.to_b = torch.nn.Linear(4, 3)

    def forward(self, x):
        a = 0.5 * torch.tanh(self.to_a(x)).unflatten(-1, (3, 3))
        _, h = associative_scan(_compose, (a, self.to_b(x)), dim=1, combine_mode="generic")
        return h


def _model():
    torch.manual_seed(0)
    return MatrixRecurrence().eval()


def _inputs(b, t):
    inputs = {"x": torch.randn(b, t, 4, generator=torch.Generator().manual_seed(b * 100 + t))}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(2, 7))


def ALT_INPUTS():
    return _inputs(3, 12)
