"""S56 (sibling of e12, ops inside ``torch.cond`` branches): branches over a ``[batch, seq, hidden]`` activation
(a 3-D ``Linear``, so a symbolic reshape around the matmul) with the other ops XNNPACK's partitioner keeps whole:
``hardswish`` and ``PReLU`` in one branch, ``Linear`` + ``hardswish`` in the other. Batch and sequence are dynamic;
the two runs take different branches.
"""
import torch
from torch.export import Dim

DYNAMIC_SHAPES = ({0: Dim("batch", min=1, max=8), 1: Dim("seq", min=2, max=16)},)


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.alt = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.act = torch.nn.PReLU()  # one slope (channels would be dim 1, the sequence here)

    def forward(self, x):
        def small(h):
            return self.act(torch.nn.functional.hardswish(self.proj(h)))

        def large(h):
            return torch.nn.functional.hardswish(self.alt(h)) * 0.5

        return torch.cond(x.sum() > 0, small, large, (x,))


def _model():
    torch.manual_seed(0)
    return Gated().eval()


def _inputs(b, s, shift):
    inputs = {"x": torch.randn(b, s, 8, generator=torch.Generator().manual_seed(b * 10 + s)) + shift}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(2, 5, 1.0))


def ALT_INPUTS():
    return _inputs(3, 7, -1.0)
