"""C01: repeat_interleave with a per-row repeat-count tensor (pytorch/pytorch#156873).

Each row of `x` is repeated `counts[i]` times along dim 0; the output length is data-dependent.
Expected: the eager result (rows 0,0,1,2,2,2 for counts [2,1,3]).
"""
import torch


class RepeatRows(torch.nn.Module):
    def forward(self, x, counts):
        return torch.repeat_interleave(x, counts, dim=0) * 2.0


def build():
    torch.manual_seed(0)
    model = RepeatRows().eval()
    x = torch.randn(3, 4)
    counts = torch.tensor([2, 1, 3])
    with torch.no_grad():
        expected = model(x, counts)
    return model, (x, counts), expected

