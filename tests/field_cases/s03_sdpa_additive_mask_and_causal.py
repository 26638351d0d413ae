"""S03 (sibling of C03): fully masked rows with an additive ``-inf`` mask, and ``is_causal`` with L > S.

An additive float mask whose row is all ``-inf`` (padding built as ``(1 - mask) * -inf``) gives zeros in
eager, like a boolean all-False row. ``is_causal=True`` with more queries than keys must keep torch's
top-left-aligned causal mask. Expected: the eager values.
"""
import torch
import torch.nn.functional as F


class MaskedAndCausal(torch.nn.Module):
    def forward(self, q, k, v, additive_mask):
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask)
        causal = F.scaled_dot_product_attention(q, k[:, :, :3], v[:, :, :3], is_causal=True)
        return masked, causal


def build():
    torch.manual_seed(0)
    q = torch.randn(1, 4, 5, 8)
    k = torch.randn(1, 4, 5, 8)
    v = torch.randn(1, 4, 5, 8)
    additive_mask = torch.zeros(1, 4, 5, 5)
    additive_mask[0, 2, 3, :] = float("-inf")  # head 2, query 3 sees nothing
    additive_mask[0, :, :, 4] = float("-inf")  # the last key is padding for everyone
    model = MaskedAndCausal().eval()
    with torch.no_grad():
        expected = model(q, k, v, additive_mask)
    return model, (q, k, v, additive_mask), expected
