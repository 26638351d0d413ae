"""S71 (sibling of f05): learnable fake-quant (LSQ-style `_LearnableFakeQuantize`, its qparams trained as
parameters): per-tensor symmetric on the activations of a conv, per-channel affine (float zero points, rounded by
the op) on its weight; `static_enabled` off after calibration, as after QAT. Batch and width dynamic.

Expected: eager output (2, 4, 5, 9), and from the same program at batch 3, width 12.
"""
import torch
from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize
from torch.ao.quantization.observer import MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=1, max=8), 3: Dim("width", min=4, max=32)}}


class LSQConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act_fq = _LearnableFakeQuantize(MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
                                             dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
        self.w_fq = _LearnableFakeQuantize(MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                           dtype=torch.qint8, qscheme=torch.per_channel_affine, ch_axis=0,
                                           channel_len=4)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.nn.functional.conv2d(self.act_fq(x), self.w_fq(self.conv.weight), self.conv.bias, padding=1)


def _model():
    torch.manual_seed(0)
    m = LSQConv().train()
    with torch.no_grad():  # calibrate, then train the qparams a little (moved off the observer's values)
        m.act_fq(torch.randn(4, 3, 5, 9, generator=torch.Generator().manual_seed(1)) * 2.0)
        m.w_fq(m.conv.weight)
        m.act_fq.scale.mul_(1.1)
        m.w_fq.zero_point.add_(torch.tensor([0.3, -1.6, 2.5, 0.0]))
    for fq in (m.act_fq, m.w_fq):
        fq.toggle_observer_update(False)
    return m.eval()


def _inputs(b, w):
    inputs = {"x": torch.randn(b, 3, 5, w, generator=torch.Generator().manual_seed(b * 10 + w)) * 2.0}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(2, 9))


def ALT_INPUTS():
    return _inputs(3, 12)
