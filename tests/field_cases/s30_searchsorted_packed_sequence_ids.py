"""S30 (sibling of d04, non-Core-ATen ops on ExecuTorch): the sequence id and in-sequence position of every token
of a packed batch, from cumulative lengths with ``torch.searchsorted(cu_seqlens, positions, right=True)`` (the
varlen / packed-sequence pattern of flash-attention callers), plus ``side="left"`` with ``out_int32``.
``aten.searchsorted.Tensor`` is not Core ATen, has no portable kernel and no torch._decomp decomposition (nor an
ONNX function): hfexport decomposes it as a comparison and a sum on both.

The number of sequences (the boundaries) and the number of tokens are both dynamic; the second shape packs four
sequences instead of three.
"""
import torch
from torch.export import Dim


class PackedPositions(torch.nn.Module):
    def forward(self, cu_seqlens, token_pos):
        seq_id = torch.searchsorted(cu_seqlens, token_pos, right=True) - 1  # which sequence holds the token
        start = torch.gather(cu_seqlens, 0, seq_id)
        ends = torch.searchsorted(cu_seqlens, token_pos + 1, side="left", out_int32=True)
        return seq_id, token_pos - start, ends


DYNAMIC_SHAPES = ({0: Dim("n_bounds", min=2, max=64)}, {0: Dim("n_tokens", min=2, max=256)})


def _case(lengths):
    cu = torch.cumsum(torch.tensor([0, *lengths]), 0)
    inputs = {"cu_seqlens": cu, "token_pos": torch.arange(int(cu[-1]))}
    with torch.no_grad():
        expected = PackedPositions()(**inputs)
    return inputs, expected


def build():
    inputs, expected = _case([3, 5, 2])
    return PackedPositions().eval(), inputs, expected


def ALT_INPUTS():
    return _case([4, 1, 6, 2])


if __name__ == "__main__":
    print(build()[2])
