"""S51 (sibling of e06, non-Core-ATen ops on ExecuTorch): int2 weights packed four to a byte (the 2-bit
GPTQ/HQQ layout), unpacked with ``(packed.unsqueeze(-1) >> shifts) & 3`` where ``shifts`` is a buffer
``[0, 2, 4, 6]`` (a shift by a *tensor*, broadcast), then an in-place ``>>=`` on an int32 zero-point tensor
(``__irshift__``, functionalized by torch.export). Batch and sequence of x are dynamic.
"""
import torch
from torch.export import Dim

B, S = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = ({0: B, 1: S},)


class PackedInt2Linear(torch.nn.Module):
    def __init__(self, in_features=8, out_features=5):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        q = torch.randint(0, 4, (out_features, in_features), generator=g, dtype=torch.uint8)
        packed = q[:, 0::4] | (q[:, 1::4] << 2) | (q[:, 2::4] << 4) | (q[:, 3::4] << 6)
        self.register_buffer("packed", packed)
        self.register_buffer("shifts", torch.tensor([0, 2, 4, 6], dtype=torch.uint8))
        self.register_buffer("zeros", torch.full((out_features, 1), 2 << 3, dtype=torch.int32))
        self.register_buffer("scale", torch.rand(out_features, 1, generator=g) * 0.1 + 0.05)

    def forward(self, x):
        w = (self.packed.unsqueeze(-1) >> self.shifts) & 3  # [out, in/4, 4]
        w = w.reshape(self.packed.shape[0], -1).to(torch.int32)
        zero = self.zeros.clone()
        zero >>= 3
        w = (w - zero).to(torch.float32) * self.scale
        return x @ w.t()


def _inputs(b, s):
    inputs = {"x": torch.randn(b, s, 8, generator=torch.Generator().manual_seed(b * 10 + s))}
    with torch.no_grad():
        return inputs, PackedInt2Linear().eval()(**inputs)


def build():
    return (PackedInt2Linear().eval(), *_inputs(2, 5))


def ALT_INPUTS():
    return _inputs(3, 11)


if __name__ == "__main__":
    print(build()[2][0, 0])
