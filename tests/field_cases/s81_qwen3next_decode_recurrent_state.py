"""S81 (sibling of f11: dict-held states of a hybrid cache mutated in place): a decode step of a tiny
Qwen3NextForCausalLM (one `linear_attention` layer, one `full_attention` layer, 4 experts) with the cache of a
6-token prefill passed in. The gated delta layer holds two dicts, `conv_states = {0: ...}` and
`recurrent_states = {0: ...}`; the step rolls the conv state in place (`causal_conv1d_update`) and copies the
new recurrent state into the old one (`update_recurrent_state`'s `copy_`), both through the recurrent
(single-token) rule.

Expected: eager logits (1, 1, 128) of the decode step.
"""
import copy
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
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
    inputs = {"input_ids": torch.tensor([[42]]), "attention_mask": torch.ones(1, 7, dtype=torch.long),
              "past_key_values": cache, "use_cache": True}
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs)).logits
    return model, inputs, expected
