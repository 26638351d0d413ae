"""S19 (sibling of C19): ``chunk(2)`` and a symbolic two-way ``split`` along a dynamic axis of a 4-D tensor
(head-split of a packed projection). Expected: eager output; also at a second length.
"""
import torch
from torch.export import Dim

SEQ = Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = ({2: 2 * SEQ},)


class HalfAndHalf(torch.nn.Module):
    def forward(self, x):
        left, right = x.chunk(2, dim=2)
        top, bottom = torch.split(x, [x.shape[2] // 2, x.shape[2] // 2], dim=2)
        return left * right + (top - bottom)


def _inp(seq):
    return (torch.randn(1, 2, 2 * seq, 4, generator=torch.Generator().manual_seed(seq)),)


def build():
    model = HalfAndHalf().eval()
    inputs = _inp(3)
    with torch.no_grad():
        return model, inputs, model(*inputs)


def ALT_INPUTS():
    model = HalfAndHalf().eval()
    inputs = _inp(6)
    with torch.no_grad():
        return inputs, model(*inputs)
