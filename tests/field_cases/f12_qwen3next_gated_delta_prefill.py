"""F12: a hybrid linear-attention model's prefill through the reference (pure PyTorch) chunked gated delta rule
(tiny Qwen3NextForCausalLM: one `linear_attention` layer, one `full_attention` layer, 4 experts)
(sonos/torch-to-nnef#330, https://github.com/sonos/torch-to-nnef/pull/330, merged, 2026-08, "Qwen 3.5 MoE
hybrid-attention export": exporting HF gated-delta-net layers, `aten::copy_` into cache buffers exported as constant
zeros and buffers mutated through a view (`buf[:, :, i] = x`) were not renamed, so the graph silently read stale
values; microsoft/onnxruntime-genai#2442, 2026-08, "Add GatedDeltaNet evaluation export for Qwen hybrid models").

The chunked rule pads the sequence to a multiple of the chunk, writes rows of a (chunk x chunk) matrix in place in
a Python loop (`attn[..., i, :i] = ...`), and updates the recurrent state chunk by chunk; the causal conv1d runs
its PyTorch fallback. `use_cache=False`, static length 10.

Expected: eager logits (1, 10, 128).
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM


def build():
    torch.manual_seed(0)
    cfg = Qwen3NextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                          layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4,
                          linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                          attn_implementation="sdpa")
    model = Qwen3NextForCausalLM(cfg).eval()
    inputs = {"input_ids": torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(6)),
              "use_cache": False}
    with torch.no_grad():
        expected = model(**inputs).logits
    return model, inputs, expected

