"""S18 (sibling of C18): other Python-float-minus-integer-tensor promotions: ``0.5 - int32``, ``torch.rsub``
with a float scalar, and a float minus a bool mask cast to int64. Expected: eager float32 results.
"""
import torch


class ScalarMinusInt(torch.nn.Module):
    def forward(self, x, mask32, flags):
        a = (0.5 - mask32) * x
        b = torch.rsub(mask32, 2.5)
        c = 3.0 - (flags > 0).long()
        return a, b, c


def build():
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    mask32 = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.int32)
    flags = torch.tensor([[2, -1, 0], [5, 0, -3]])
    model = ScalarMinusInt().eval()
    with torch.no_grad():
        expected = model(x, mask32, flags)
    return model, (x, mask32, flags), expected
