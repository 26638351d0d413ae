"""S59 (sibling of e02, a Linear under ``torch.vmap`` on XNNPACK): per-sample sequences ``[batch, seq, 8]``
through ``vmap`` (a 3-D ``matmul`` per sample), a bias-free Linear (``vmap`` over ``nn.Linear(bias=False)``), and
a Linear on a pooled 1-D vector inside the vmapped function (``unsqueeze, mm, squeeze, add`` again). Batch and
sequence are dynamic.
"""
import torch
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=2, max=16), 1: Dim("seq", min=2, max=16)}}


class Member(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)
        self.score = torch.nn.Linear(8, 2)

    def forward(self, seq):  # seq [seq, 8]: one sample
        h = torch.relu(self.proj(seq))
        return self.score(h.mean(0)), h


class Ensemble(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.member = Member()

    def forward(self, x):
        scores, hidden = torch.vmap(self.member)(x)
        return scores.softmax(-1), hidden.sum(1)


def _model():
    torch.manual_seed(0)
    return Ensemble().eval()


def _inputs(b, s):
    inputs = {"x": torch.randn(b, s, 8, generator=torch.Generator().manual_seed(b * 10 + s))}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(4, 6))


def ALT_INPUTS():
    return _inputs(7, 3)
