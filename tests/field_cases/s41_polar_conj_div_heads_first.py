"""S41 (d14's kind): complex arithmetic beyond one product, heads-first layout, ``torch.polar`` from an input.

``x`` is ``[batch, heads, seq, head_dim]`` (DeepSeek-V2's layout, not Llama4's ``[batch, seq, heads, ...]``);
``freqs = torch.polar(magnitude, positions[:, None, :, None] * inv_freq)`` is built in forward from float
positions given as an input and broadcast over heads. The module rotates, rotates back with the conjugate,
divides by a second complex tensor made with ``torch.complex``, adds a Python complex scalar and returns the real
part, the imaginary part, the magnitude (``abs``) and ``view_as_real`` of a ``cat`` of two complex tensors.

Expected: four float tensors for batch 2, seq 3; ALT_INPUTS: batch 2, seq 7 (dynamic seq).
"""
import torch
from torch.export import Dim

HEADS, HEAD_DIM = 2, 8


class ComplexMix(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)))
        self.magnitude = torch.nn.Parameter(torch.rand(HEAD_DIM // 2, generator=torch.Generator().manual_seed(3))
                                            + 0.5)

    def forward(self, x, positions):
        angles = positions[:, None, :, None] * self.inv_freq  # [b, 1, s, d/2]
        freqs = torch.polar(self.magnitude.expand_as(angles), angles)
        z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # [b, h, s, d/2]
        rotated = z * freqs
        back = rotated * freqs.conj()
        w = torch.complex(x[..., 0::2] + 2.0, x[..., 1::2])
        ratio = back / w + (0.5 - 0.25j)
        both = torch.cat([rotated, ratio.transpose(2, 3).transpose(2, 3)], dim=-1)
        return ratio.real, ratio.imag, rotated.abs(), torch.view_as_real(both).flatten(-2)


def _case(seq):
    torch.manual_seed(0)
    model = ComplexMix().eval()
    g = torch.Generator().manual_seed(seq)
    x = torch.randn(2, HEADS, seq, HEAD_DIM, generator=g)
    positions = torch.arange(seq, dtype=torch.float32).repeat(2, 1) + torch.tensor([[0.0], [3.5]])
    with torch.no_grad():
        return model, (x, positions), model(x, positions)


DYNAMIC_SHAPES = ({2: Dim("seq", min=2, max=32)}, {1: Dim("seq", min=2, max=32)})


def build():
    return _case(3)


def ALT_INPUTS():  # noqa: N802 - the field-case contract's name
    _, inputs, expected = _case(7)
    return inputs, expected


if __name__ == "__main__":
    print([t.shape for t in build()[2]])
