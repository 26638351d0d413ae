"""S70 (sibling of f05): a QAT MLP in eval with the fused observer/fake-quant module on its activations, a per-channel
`FakeQuantize` on its weight (`default_per_channel_weight_fake_quant`, symmetric int8, axis 0) and a second activation
fake-quant whose fake-quant is disabled (the identity). Observers calibrated, then disabled. Batch dynamic.

Expected: eager output (3, 5), and from the same program at batch 6.
"""
import torch
from torch.ao.quantization import FusedMovingAvgObsFakeQuantize, default_per_channel_weight_fake_quant
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=1, max=16)}}


class QATMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act_fq = FusedMovingAvgObsFakeQuantize()
        self.w_fq = default_per_channel_weight_fake_quant()
        self.off_fq = torch.ao.quantization.FakeQuantize()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 5)

    def forward(self, x):
        h = torch.nn.functional.linear(self.act_fq(x), self.w_fq(self.fc1.weight), self.fc1.bias)
        return self.fc2(self.off_fq(torch.relu(h)))


def _model():
    torch.manual_seed(0)
    m = QATMLP().train()
    with torch.no_grad():  # calibrate every observer, then freeze them and switch one fake-quant off
        m.act_fq(torch.randn(64, 8, generator=torch.Generator().manual_seed(1)) * 3.0)
        m.w_fq(m.fc1.weight)
        m.off_fq(torch.randn(64, 16))
    m.apply(torch.ao.quantization.disable_observer)
    m.off_fq.disable_fake_quant()
    return m.eval()


def _inputs(b):
    inputs = {"x": torch.randn(b, 8, generator=torch.Generator().manual_seed(10 + b)) * 3.0}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(3))


def ALT_INPUTS():
    return _inputs(6)
