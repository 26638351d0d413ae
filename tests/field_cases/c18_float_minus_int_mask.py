"""C18: `1.0 - int_mask` (python float minus an int64 tensor) as used to build additive attention masks
(pytorch/pytorch#194381: ConversionError in the ONNX type-promotion pass, regression in torch 2.13.0).

Expected: eager float32 result (1.0 - mask) * x.
"""
import torch


class InvertMask(torch.nn.Module):
    def forward(self, x, mask):
        return (1.0 - mask) * x


def build():
    torch.manual_seed(0)
    model = InvertMask().eval()
    x = torch.randn(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    with torch.no_grad():
        expected = model(x, mask)
    return model, (x, mask), expected

