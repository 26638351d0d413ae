"""S76 (sibling of f04): a fixed-point iteration with `while_loop` that stops on convergence or at a cap: carried
`(step, h, delta)`, the condition reads a closure tensor (the tolerance) and the body calls a module (`Linear` +
`LayerNorm`) and a parameter; the trip count depends on the data (4 in the traced input, 7 in the second).

Expected: eager output (3, 5) and the step count, and from the same program for the second input.
"""
import torch
from torch._higher_order_ops import while_loop


class FixedPoint(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Linear(5, 5)
        self.norm = torch.nn.LayerNorm(5)
        self.damping = torch.nn.Parameter(torch.tensor(0.5))
        self.register_buffer("tol", torch.tensor(0.05))

    def forward(self, x, cap):
        def cond_fn(step, h, delta):
            return (delta > self.tol) & (step < cap)

        def body_fn(step, h, delta):
            new = self.damping * h + (1 - self.damping) * torch.tanh(self.norm(self.mix(h)) + x)
            return step + 1, new, (new - h).abs().max()

        step, h, _ = while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x, torch.tensor(1.0)))
        return h, step


def _model():
    torch.manual_seed(0)
    return FixedPoint().eval()


def _inputs(scale, cap):
    inputs = {"x": torch.randn(3, 5, generator=torch.Generator().manual_seed(4)) * scale, "cap": torch.tensor(cap)}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(1.0, 4))


def ALT_INPUTS():
    return _inputs(1.0, 7)
