"""S73 (sibling of f01): a time-major stack: a two-layer bidirectional `nn.GRU` with a given initial state, then a
one-layer `nn.RNN(nonlinearity="relu")` over its outputs, time and batch dynamic (`batch_first=False`).

Expected: eager (outputs (9, 2, 4), GRU h_n (4, 2, 6), RNN h_n (1, 2, 4)), and at time 5, batch 4.
"""
import torch
from torch.export import Dim

T, B = Dim("time", min=2, max=64), Dim("batch", min=1, max=8)
DYNAMIC_SHAPES = {"x": {0: T, 1: B}, "h0": {1: B}}


class StackedRecurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(3, 6, num_layers=2, bidirectional=True)
        self.rnn = torch.nn.RNN(12, 4, nonlinearity="relu")

    def forward(self, x, h0):
        y, h_gru = self.gru(x, h0)
        z, h_rnn = self.rnn(y)
        return z, h_gru, h_rnn


def _model():
    torch.manual_seed(0)
    return StackedRecurrent().eval()


def _inputs(t, b):
    g = torch.Generator().manual_seed(t * 10 + b)
    inputs = {"x": torch.randn(t, b, 3, generator=g), "h0": torch.randn(4, b, 6, generator=g)}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(9, 2))


def ALT_INPUTS():
    return _inputs(5, 4)
