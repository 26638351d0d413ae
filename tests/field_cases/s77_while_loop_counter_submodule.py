"""S77 (sibling of f04): a `while_loop` whose counter is computed from the input (`2 + number of rows with a
positive sum`) and whose body runs a two-layer MLP submodule on one carried tensor and accumulates into a second;
batch dynamic.

Expected: eager outputs (4, 6) twice, and from the same program at batch 8 (7 iterations instead of 4).
"""
import torch
from torch._higher_order_ops import while_loop
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=2, max=16)}}


class Accumulate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 6))

    def forward(self, x):
        count = 2 + (x.sum(-1) > 0).sum()

        def cond_fn(i, h, acc):
            return i < count

        def body_fn(i, h, acc):
            h = self.mlp(h) * 0.5 + h
            return i + 1, h, acc + h

        _, h, acc = while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x, torch.zeros_like(x)))
        return h, acc


def _model():
    torch.manual_seed(0)
    return Accumulate().eval()


def _inputs(b):
    inputs = {"x": torch.randn(b, 6, generator=torch.Generator().manual_seed(b))}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(4))


def ALT_INPUTS():
    return _inputs(8)
