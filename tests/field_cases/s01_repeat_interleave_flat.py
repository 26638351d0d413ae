"""S01 (sibling of C01): the other non-Core-ATen repeat_interleave overloads.

``x.repeat_interleave(counts)`` without ``dim`` flattens and repeats (``aten.repeat_interleave.self_Tensor``),
and ``torch.repeat_interleave(counts)`` turns counts into indices (``aten.repeat_interleave.Tensor``), as
MoE token dispatch does. Expected: the eager values.
"""
import torch


class DispatchTokens(torch.nn.Module):
    def forward(self, x, counts):
        flat = x.repeat_interleave(counts) + 1.0
        owner = torch.repeat_interleave(counts)
        return flat, owner


def build():
    model = DispatchTokens().eval()
    x = torch.tensor([0.5, -1.0, 2.0, 3.0])
    counts = torch.tensor([1, 0, 3, 2])
    with torch.no_grad():
        expected = model(x, counts)
    return model, (x, counts), expected
