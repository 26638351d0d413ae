"""C03: SDPA with a boolean attn_mask where one query row is fully masked (microsoft/onnxscript#2479,
pytorch/pytorch#159973). Padding tokens produce all-False rows.

Expected: the eager torch value (torch returns finite values / zeros for the fully-masked row, no NaN).
"""
import torch
import torch.nn.functional as F


class BoolMaskAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def build():
    torch.manual_seed(0)
    q = k = v = torch.randn(2, 2, 5, 8)
    mask = torch.ones(2, 2, 5, 5, dtype=torch.bool)
    mask[0, 0, 0, :] = False  # query row 0 of batch 0 / head 0 sees nothing
    model = BoolMaskAttention().eval()
    with torch.no_grad():
        expected = model(q, k, v, mask)
    return model, (q, k, v, mask), expected

