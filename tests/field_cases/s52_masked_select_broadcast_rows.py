"""S52 (sibling of e10, data-dependent output sizes on ONNX): ``masked_select`` with a mask that broadcasts
against the input (a per-row keep flag ``[rows, 1]`` against ``[rows, 6]``, and an input ``[6]`` against a mask
``[rows, 6]``), and boolean indexing of rows (``x[keep]``, the token-pruning pattern). The number of rows is
dynamic; how many values are kept differs between the two runs.
"""
import torch
from torch.export import Dim


class KeepRows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 6))

    def forward(self, x, keep):
        by_row = torch.masked_select(x, keep.unsqueeze(-1))  # [rows, 1] mask against [rows, 6]
        by_value = self.bias.masked_select(x > 0.5)  # [6] input against a [rows, 6] mask
        rows = x[keep] * 2.0  # boolean index: [kept rows, 6]
        return by_row, by_value, rows


DYNAMIC_SHAPES = ({0: Dim("rows", min=2, max=32)}, {0: Dim("rows", min=2, max=32)})


def _case(rows, seed):
    g = torch.Generator().manual_seed(seed)
    inputs = {"x": torch.rand(rows, 6, generator=g), "keep": torch.rand(rows, generator=g) > 0.5}
    torch.manual_seed(0)
    with torch.no_grad():
        return inputs, KeepRows()(**inputs)


def build():
    inputs, expected = _case(5, 0)
    return KeepRows().eval(), inputs, expected


def ALT_INPUTS():
    return _case(9, 3)
