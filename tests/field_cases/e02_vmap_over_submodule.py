"""E02: `torch.vmap` over a submodule inside forward (pytorch/pytorch#153063,
https://github.com/pytorch/pytorch/issues/153063, open, "export fails to trace with functorch": `vmap(self.model)(x)`
fails in export with an AssertionError in `_free_unbacked_symbols_with_path`).

Per-sample application of a small shared MLP with `torch.vmap` (the ensembling / per-example pattern), followed by
a reduction. The batch axis is dynamic.

Expected: eager output (16, 4), and from the same program at batch 5.
"""
import torch
from torch.export import Dim

B = Dim("batch", min=2, max=64)
DYNAMIC_SHAPES = {"x": {0: B}}
REF_CONFIG = {"dynamic_shapes": DYNAMIC_SHAPES}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.linear(x))


class Batched(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Tiny()

    def forward(self, x):
        return torch.vmap(self.model)(x) * 2.0 - 1.0


def _model():
    torch.manual_seed(0)
    return Batched().eval()


def _inputs(b):
    inputs = {"x": torch.randn(b, 8, generator=torch.Generator().manual_seed(b))}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(16))


def ALT_INPUTS():
    return _inputs(5)
