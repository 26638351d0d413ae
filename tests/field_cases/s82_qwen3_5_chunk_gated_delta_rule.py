"""S82 (sibling of f12: an XNNPACK partition whose output is also one of its inputs): Qwen3.5's reference chunked
gated delta rule (`transformers.models.qwen3_5.modeling_qwen3_5.torch_chunk_gated_delta_rule`, the same loop as
Qwen3-Next, OLMo-Hybrid, Kimi-Linear, Bailing-Hybrid), called directly with a chunk of 4 on 6 tokens (padded to 8)
and an initial state: the in-place row loop `ut[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)` reads each
row slice twice.

Expected: eager (output (1, 6, 2, 8), final state (1, 2, 8, 8)).
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule


class ChunkedGatedDelta(torch.nn.Module):
    def forward(self, query, key, value, g, beta, state):
        return torch_chunk_gated_delta_rule(query, key, value, g=g, beta=beta, chunk_size=4, initial_state=state,
                                            output_final_state=True, use_qk_l2norm_in_kernel=True)


def build():
    gen = torch.Generator().manual_seed(12)
    inputs = {"query": torch.randn(1, 6, 2, 8, generator=gen), "key": torch.randn(1, 6, 2, 8, generator=gen),
              "value": torch.randn(1, 6, 2, 8, generator=gen), "g": -torch.rand(1, 6, 2, generator=gen),
              "beta": torch.rand(1, 6, 2, generator=gen), "state": torch.randn(1, 2, 8, 8, generator=gen) * 0.1}
    model = ChunkedGatedDelta().eval()
    with torch.no_grad():
        expected = model(**inputs)
    return model, inputs, tuple(expected)
