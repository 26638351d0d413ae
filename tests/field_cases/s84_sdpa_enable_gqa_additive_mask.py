"""S84 (sibling of the OpenVINO parity kind `enable_gqa`): `F.scaled_dot_product_attention(..., enable_gqa=True)`
with 6 query heads over 2 key/value heads, an additive float mask and no causal flag, keys longer than queries (a
decode-with-cache shape: 3 queries, 7 keys).

Expected: eager (2, 6, 3, 8).
"""
import torch
import torch.nn.functional as F


class GroupedAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def build():
    gen = torch.Generator().manual_seed(15)
    mask = torch.zeros(2, 1, 3, 7)
    mask[0, :, :, :2] = float("-inf")  # left padding of the first sequence
    inputs = {"q": torch.randn(2, 6, 3, 8, generator=gen), "k": torch.randn(2, 2, 7, 8, generator=gen),
              "v": torch.randn(2, 2, 7, 8, generator=gen), "mask": mask}
    model = GroupedAttention().eval()
    with torch.no_grad():
        expected = model(**inputs)
    return model, inputs, expected
