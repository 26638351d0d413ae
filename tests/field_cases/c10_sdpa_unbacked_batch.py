"""C10: SDPA whose batch dim comes from boolean selection (unbacked size) plus a 4-D mask
(pytorch/pytorch#180202, pytorch/pytorch#181084). Vision-encoder pattern: keep only real image tiles.

Expected: the eager attention output for the selected rows.
"""
import torch
import torch.nn.functional as F


class SelectThenAttend(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        self.k = torch.nn.Linear(16, 16)
        self.v = torch.nn.Linear(16, 16)

    def forward(self, x, keep, mask):
        x = x[keep]  # (u0, seq, 16)
        mask = mask[keep]  # (u0, 1, seq, seq)
        b, s = x.shape[0], x.shape[1]
        q, k, v = (p(x).view(b, s, 2, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, 16)


def build():
    torch.manual_seed(0)
    model = SelectThenAttend().eval()
    x = torch.randn(3, 4, 16)
    keep = torch.tensor([True, False, True])
    mask = torch.ones(3, 1, 4, 4, dtype=torch.bool)
    with torch.no_grad():
        expected = model(x, keep, mask)
    return model, (x, keep, mask), expected

