"""S58 (sibling of e02, a Linear under ``torch.vmap`` on XNNPACK): ``vmap`` over a two-Linear MLP (each Linear
decomposed per sample as ``unsqueeze, view, mm, view, squeeze, add(bias)``), and ``vmap(linear, in_dims=1)``,
which puts a ``permute`` in front of the ``mm``. The batch is dynamic. XNNPACK's Linear rewrite dropped both
biases of the first (max abs diff 0.21) and failed on the second ("a and b must have same reduction dim").
"""
import torch
from torch.export import Dim

B = Dim("batch", min=2, max=32)
DYNAMIC_SHAPES = {"x": {0: B}, "columns": {1: B}}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


class PerSample(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp, self.head = Mlp(), torch.nn.Linear(8, 3)

    def forward(self, x, columns):  # x [batch, 8], columns [8, batch]
        return torch.vmap(self.mlp)(x), torch.vmap(self.head, in_dims=1)(columns)


def _model():
    torch.manual_seed(0)
    return PerSample().eval()


def _inputs(b):
    g = torch.Generator().manual_seed(b)
    inputs = {"x": torch.randn(b, 8, generator=g), "columns": torch.randn(8, b, generator=g)}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(6))


def ALT_INPUTS():
    return _inputs(11)
