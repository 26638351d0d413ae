"""E12: an early-exit branch written with `torch.cond` whose branches call different submodules
(pytorch/pytorch#143192, https://github.com/pytorch/pytorch/issues/143192, closed, "onnx export with dynamo using
torch.cond for dynamic models throws error"; the same early-exit ViT in pytorch/pytorch#145300, closed).

`torch.cond(h.mean() > 0, exit_fn, continue_fn, (h,))`: the early-exit branch applies a small head, the other
branch runs one more block then the final head. Both branches close over module parameters (lifted into the
subgraphs). Batch is dynamic.

Expected: eager output (3, 4) for an input that takes the early exit, and from the same program for one that does
not (batch 5).
"""
import torch
from torch.export import Dim

B = Dim("batch", min=2, max=16)
DYNAMIC_SHAPES = {"x": {0: B}}
REF_CONFIG = {"dynamic_shapes": DYNAMIC_SHAPES}


class EarlyExit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(8, 16)
        self.block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
        self.exit_head = torch.nn.Linear(16, 4)
        self.last_head = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.stem(x)

        def exit_fn(h):
            return self.exit_head(h)

        def continue_fn(h):
            return self.last_head(self.block(h) + h)

        return torch.cond(h.mean() > 0, exit_fn, continue_fn, (h,))


def _model():
    torch.manual_seed(0)
    return EarlyExit().eval()


def _inputs(b, shift):
    model = _model()
    x = torch.randn(b, 8, generator=torch.Generator().manual_seed(b))
    with torch.no_grad():
        # shift the input along the direction that moves mean(stem(x)) so the branch is known
        w = model.stem.weight.sum(0)
        x = x + shift * w / w.norm()
        return {"x": x}, model(x)


def build():
    return (_model(), *_inputs(3, 4.0))


def ALT_INPUTS():
    return _inputs(5, -4.0)
