"""F05: a quantization-aware-trained block kept with its fake-quantize modules, exported in eval
(pytorch/pytorch#167063, https://github.com/pytorch/pytorch/issues/167063, open, 2025-11, "`torch.onnx.export` with
`dynamo` breaks `FakeQuantize` exporting": both torch.export strategies fail on an eval `FakeQuantize` with its
observer disabled; openvinotoolkit/openvino#30608, https://github.com/openvinotoolkit/openvino/issues/30608, open,
2025-05, "Convert torch.fake_quantize_per_tensor_affine from ExportedProgram will fail").

An activation `torch.ao.quantization.FakeQuantize` (calibrated, then observer disabled; its forward branches on the
`fake_quant_enabled` / `observer_enabled` buffers), per-channel int8 weight fake-quant with
`torch.fake_quantize_per_channel_affine`, and a per-tensor output fake-quant with
`torch.fake_quantize_per_tensor_affine`. Batch dynamic. The quantization step is checked to matter (the output
moves by more than the tolerance without it).

Expected: eager output (3, 4), and from the same program at batch 5.
"""
import torch
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=1, max=16)}}
REF_CONFIG = {"dynamic_shapes": DYNAMIC_SHAPES}


class QATLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act_fq = torch.ao.quantization.FakeQuantize()
        self.linear = torch.nn.Linear(8, 4)
        w = self.linear.weight.detach()
        self.register_buffer("w_scale", w.abs().amax(1) / 127.0)
        self.register_buffer("w_zp", torch.zeros(4, dtype=torch.int32))

    def forward(self, x):
        x = self.act_fq(x)
        w = torch.fake_quantize_per_channel_affine(self.linear.weight, self.w_scale, self.w_zp, 0, -128, 127)
        y = torch.nn.functional.linear(x, w, self.linear.bias)
        return torch.fake_quantize_per_tensor_affine(y, 0.05, 0, -128, 127)


def _model():
    torch.manual_seed(0)
    m = QATLinear()
    m.train()
    with torch.no_grad():  # calibrate the activation observer, then freeze it
        m.act_fq(torch.randn(64, 8, generator=torch.Generator().manual_seed(1)) * 2.0)
    m.act_fq.disable_observer()
    return m.eval()


def _inputs(b):
    inputs = {"x": torch.randn(b, 8, generator=torch.Generator().manual_seed(b)) * 2.0}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(3))


def ALT_INPUTS():
    return _inputs(5)

