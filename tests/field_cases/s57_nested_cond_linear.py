"""S57 (sibling of e12, ops inside ``torch.cond`` branches): a ``torch.cond`` nested in a branch of another (a
two-level early exit), with ``nn.Linear`` and ``LayerNorm`` at both levels. Batch is dynamic; the two runs take
different paths (outer true; outer false then inner true).
"""
import torch
from torch.export import Dim

DYNAMIC_SHAPES = ({0: Dim("batch", min=2, max=16)},)


class TwoExits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.head1, self.head2, self.head3 = (torch.nn.Linear(6, 6) for _ in range(4))
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x):
        h = self.stem(x)

        def first(h):
            return self.head1(h)

        def rest(h):
            g = self.norm(h)
            return torch.cond(g.mean() < 0.5, lambda g: self.head2(g), lambda g: self.head3(g) * 2.0, (g,))

        return torch.cond(h.mean() > 0, first, rest, (h,))


def _model():
    torch.manual_seed(0)
    return TwoExits().eval()


def _inputs(b, shift):
    model = _model()
    x = torch.randn(b, 6, generator=torch.Generator().manual_seed(b))
    with torch.no_grad():
        w = model.stem.weight.sum(0)
        x = x + shift * w / w.norm()
        return {"x": x}, model(x)


def build():
    return (_model(), *_inputs(3, 4.0))


def ALT_INPUTS():
    return _inputs(5, -4.0)
