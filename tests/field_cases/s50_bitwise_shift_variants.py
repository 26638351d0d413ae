"""S50 (sibling of e06, non-Core-ATen ops on ExecuTorch): every shift and bitwise spelling on signed int32 and
unsigned uint8 tensors: ``>>``/``<<`` by a scalar and by a tensor of amounts, ``torch.bitwise_right_shift`` /
``bitwise_left_shift`` (Tensor, Tensor_Scalar, Scalar_Tensor), ``&``, ``|``, ``^`` by a scalar and by a tensor,
and a scalar on the left (``0xFF & t``, ``1 << t``). Negative int32 values check that ``>>`` is an arithmetic shift
(floor division by a power of two) as in eager. The number of rows is dynamic.
"""
import torch
from torch.export import Dim


class BitOps(torch.nn.Module):
    def forward(self, x, amounts, flags):
        a = x >> 3
        b = x << 2
        c = x >> amounts
        d = torch.bitwise_left_shift(x, amounts)
        e = torch.bitwise_right_shift(x, 1) ^ flags.to(torch.int32)
        f = torch.bitwise_left_shift(1, amounts)  # Scalar_Tensor: a mask of one bit
        g = torch.bitwise_right_shift(-64, amounts)
        h = (flags >> 4) | (flags << 4)  # uint8 nibble swap (wraps like eager)
        i = 0x0F & flags
        j = (x & 0xFF) | amounts
        return a, b, c, d, e, f, g, h, i, j


DYNAMIC_SHAPES = ({0: Dim("rows", min=2, max=32)}, {0: Dim("rows", min=2, max=32)}, {0: Dim("rows", min=2, max=32)})


def _case(rows, seed):
    g = torch.Generator().manual_seed(seed)
    inputs = {"x": torch.randint(-1000, 1000, (rows, 6), generator=g, dtype=torch.int32),
              "amounts": torch.randint(0, 8, (rows, 6), generator=g, dtype=torch.int32),
              "flags": torch.randint(0, 256, (rows, 6), generator=g, dtype=torch.uint8)}
    with torch.no_grad():
        return inputs, BitOps()(**inputs)


def build():
    return (BitOps().eval(), *_case(3, 0))


def ALT_INPUTS():
    return _case(7, 1)


if __name__ == "__main__":
    print(build()[2][0])
