"""S34 (sibling of d12, mutated buffers whose initial value matters): a static KV cache pre-filled with a prompt
prefix (random keys and values for positions 0..3, as after a prefill or a stored system prompt), updated with
index assignment ``cache[:, :, cache_position] = new`` (``aten.index_put_``) and attended over up to the last
written position. Attention reads the prefix rows, so a cache that comes back zeroed gives a different output.
Only the first call is compared.
"""
import torch


class PrefixCacheAttention(torch.nn.Module):
    def __init__(self, heads=2, max_len=8, dim=4, prefix=4):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        k, v = torch.zeros(1, heads, max_len, dim), torch.zeros(1, heads, max_len, dim)
        k[:, :, :prefix] = torch.randn(1, heads, prefix, dim, generator=g)
        v[:, :, :prefix] = torch.randn(1, heads, prefix, dim, generator=g)
        self.register_buffer("k_cache", k)
        self.register_buffer("v_cache", v)

    def forward(self, q, k, v, cache_position):
        self.k_cache[:, :, cache_position] = k
        self.v_cache[:, :, cache_position] = v
        positions = torch.arange(self.k_cache.shape[2])
        mask = positions[None, :] <= cache_position[:, None]  # [q, max_len]: causal over the cache
        return torch.nn.functional.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)


def build():
    model = PrefixCacheAttention().eval()
    g = torch.Generator().manual_seed(5)
    inputs = {"q": torch.randn(1, 2, 2, 4, generator=g), "k": torch.randn(1, 2, 2, 4, generator=g),
              "v": torch.randn(1, 2, 2, 4, generator=g), "cache_position": torch.tensor([4, 5])}
    with torch.no_grad():
        expected = PrefixCacheAttention()(**inputs)  # a fresh copy, so `model` keeps its initial cache
    return model, inputs, expected


if __name__ == "__main__":
    print(build()[2].shape)
