"""S80 (sibling of f11: a cache's dict-held conv state mutated in place): a decode step of a tiny Lfm2MoeForCausalLM
(two `conv` layers, one of them a MoE layer, then one `full_attention` layer; conv kernel 4, so a state of 4
columns) with the cache of a 5-token prefill passed in. Two `LinearAttentionLayer`s each hold
`conv_states = {0: tensor}` and the step rolls both in place (`causal_conv1d_update`'s `conv_state.copy_`).

Expected: eager logits (1, 1, 96) of the decode step.
"""
import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM


def build():
    torch.manual_seed(0)
    cfg = Lfm2MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        num_dense_layers=1, num_experts=4, num_experts_per_tok=2, conv_L_cache=4,
                        layer_types=["conv", "conv", "full_attention"], attn_implementation="sdpa")
    model = Lfm2MoeForCausalLM(cfg).eval()
    prompt = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
    inputs = {"input_ids": torch.tensor([[7]]), "attention_mask": torch.ones(1, 6, dtype=torch.long),
              "past_key_values": cache, "use_cache": True}
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs)).logits
    return model, inputs, expected
