"""S10 (sibling of C10): attention over a batch selected with ``nonzero`` + ``index_select`` (unbacked batch),
causal, with four heads. Expected: the eager attention output for the selected rows.
"""
import torch
import torch.nn.functional as F


class KeepTilesCausal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x, keep):
        rows = torch.nonzero(keep).squeeze(-1)
        x = x.index_select(0, rows)  # (u0, seq, 16)
        b, s = x.shape[0], x.shape[1]
        q, k, v = self.qkv(x).view(b, s, 3, 4, 4).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, 16)


def build():
    torch.manual_seed(0)
    model = KeepTilesCausal().eval()
    x = torch.randn(4, 6, 16)
    keep = torch.tensor([False, True, True, False])
    with torch.no_grad():
        expected = model(x, keep)
    return model, (x, keep), expected
