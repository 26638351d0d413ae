"""S83 (sibling of f12: an XNNPACK partition whose output is also one of its inputs): the inverse of a unit
lower-triangular matrix built row by row in place from a learned projection (rank 3, no heads; the UT transform of
DeltaNet-family kernels): `row = a[:, i, :i].clone()` is read twice, by the update and by the product with the rows
above, then written back.

Expected: eager (2, 5, 5).
"""
import torch


class TriangularInverseRows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        k = self.proj(x)
        a = -(k @ k.transpose(-1, -2)).tril(-1) * 0.2
        for i in range(1, a.shape[-1]):
            row = a[:, i, :i].clone()
            sub = a[:, :i, :i].clone()
            a[:, i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        return a + torch.eye(a.shape[-1])


def build():
    torch.manual_seed(0)
    model = TriangularInverseRows().eval()
    inputs = {"x": torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(14))}
    with torch.no_grad():
        expected = model(**inputs)
    return model, inputs, expected
