"""E06: int4 weights unpacked in forward with a bit shift (pytorch/executorch#15673,
https://github.com/pytorch/executorch/issues/15673, open, "Cannot run generated .pte file due to missing
aten::bitwise_right_shift operator"; with IR checks on: `SpecViolationError: aten.bitwise_right_shift.Tensor is
not in Core ATen opset`).

A linear layer whose weight is stored as packed uint8 nibbles (two int4 values per byte, GPTQ/AWQ-style) plus a
per-output-channel scale: `lo = packed & 0xF`, `hi = packed >> 4`, interleave, subtract 8, scale, then `x @ W.T`.
Batch and sequence of x are dynamic.

Expected: eager output (2, 5, 6), and from the same program at (1, 9).
"""
import torch
from torch.export import Dim

B, S = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = {"x": {0: B, 1: S}}
REF_CONFIG = {"dynamic_shapes": DYNAMIC_SHAPES}


class PackedInt4Linear(torch.nn.Module):
    def __init__(self, in_features=8, out_features=6):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (out_features, in_features), generator=g, dtype=torch.uint8)
        self.register_buffer("packed", q[:, 0::2] | (q[:, 1::2] << 4))
        self.register_buffer("scale", torch.rand(out_features, 1, generator=g) * 0.1 + 0.05)

    def forward(self, x):
        lo = self.packed & 0xF
        hi = self.packed >> 4
        w = torch.stack([lo, hi], dim=-1).reshape(self.packed.shape[0], -1)
        w = (w.to(torch.float32) - 8.0) * self.scale
        return x @ w.t()


def _inputs(b, s):
    inputs = {"x": torch.randn(b, s, 8, generator=torch.Generator().manual_seed(b * 10 + s))}
    with torch.no_grad():
        return inputs, PackedInt4Linear().eval()(**inputs)


def build():
    return (PackedInt4Linear().eval(), *_inputs(2, 5))


def ALT_INPUTS():
    return _inputs(1, 9)
