"""S75 (sibling of f03): a pointwise `associative_scan` over a dict of tensors, reversed, on the last axis: a
discounted return-to-go `g_t = r_t + gamma_t g_{t+1}` (the pair `(gamma, r)` composed as in f03) and a running max
carried alongside; the scanned axis is dynamic.

Expected: eager outputs (2, 9) twice, and from the same program at length 14.
"""
import torch
from torch._higher_order_ops.associative_scan import associative_scan
from torch.export import Dim

DYNAMIC_SHAPES = {"rewards": {1: Dim("steps", min=2, max=64)}, "logits": {1: Dim("steps", min=2, max=64)}}


def _combine(left, right):
    return {"gamma": left["gamma"] * right["gamma"], "ret": left["ret"] * right["gamma"] + right["ret"],
            "peak": torch.maximum(left["peak"], right["peak"])}


class ReturnToGo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.discount = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, rewards, logits):
        gamma = torch.sigmoid(logits + self.discount)
        out = associative_scan(_combine, {"gamma": gamma, "ret": rewards, "peak": rewards}, dim=-1, reverse=True)
        return out["ret"], out["peak"]


def _model():
    return ReturnToGo().eval()


def _inputs(t):
    g = torch.Generator().manual_seed(t)
    inputs = {"rewards": torch.randn(2, t, generator=g), "logits": torch.randn(2, t, generator=g)}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(9))


def ALT_INPUTS():
    return _inputs(14)
