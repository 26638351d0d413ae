"""C21: torch.sort with an explicit `stable=` flag (selects aten.sort.stable, not in Core ATen), used for
token ranking / MoE routing (apple/coremltools#2782: to_edge rejects aten.sort.stable; the ExecuTorch
portable runtime has no sort kernel either).

Expected: eager sorted values and indices (descending).
"""
import torch


class RankTokens(torch.nn.Module):
    def forward(self, scores):
        vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
        order = torch.argsort(scores, dim=-1)
        return vals, idx, order


def build():
    model = RankTokens().eval()
    scores = torch.tensor([[0.3, 0.9, 0.1, 0.5], [0.2, 0.2, 0.8, 0.4]])
    with torch.no_grad():
        expected = model(scores)
    return model, (scores,), expected

