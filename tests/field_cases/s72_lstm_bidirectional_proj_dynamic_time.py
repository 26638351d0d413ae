"""S72 (sibling of f01): a two-layer bidirectional `nn.LSTM(batch_first=True, proj_size=3)` without an initial
state, its per-step outputs pooled and its final `h_n`/`c_n` returned, batch and time dynamic.

Expected: eager (pooled (2, 6), h_n (4, 2, 3), c_n (4, 2, 5)), and from the same program at batch 3, time 13.
"""
import torch
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=1, max=8), 1: Dim("time", min=2, max=64)}}


class BiLSTMEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True, proj_size=3)

    def forward(self, x):
        y, (h_n, c_n) = self.lstm(x)
        return y.mean(1), h_n, c_n


def _model():
    torch.manual_seed(0)
    return BiLSTMEncoder().eval()


def _inputs(b, t):
    inputs = {"x": torch.randn(b, t, 4, generator=torch.Generator().manual_seed(b * 100 + t))}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(2, 6))


def ALT_INPUTS():
    return _inputs(3, 13)
