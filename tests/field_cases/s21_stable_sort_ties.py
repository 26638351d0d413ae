"""S21 (sibling of C21): stable sorts with ties, ascending and descending, and ``argsort(stable=True)`` on
integers; the order among equal keys must be the input order. Expected: eager values and indices.
"""
import torch


class StableRanks(torch.nn.Module):
    def forward(self, scores, ids):
        vals, idx = torch.sort(scores, dim=-1, stable=True)
        order = torch.argsort(ids, dim=-1, descending=True, stable=True)
        return vals, idx, order


def build():
    model = StableRanks().eval()
    scores = torch.tensor([[0.5, 0.1, 0.5, 0.1, 0.3], [1.0, 1.0, 1.0, 0.0, 0.0]])
    ids = torch.tensor([[3, 1, 3, 2, 1], [0, 0, 7, 7, 0]])
    with torch.no_grad():
        expected = model(scores, ids)
    return model, (scores, ids), expected
