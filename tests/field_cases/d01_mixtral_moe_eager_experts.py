"""D01: MoE experts that loop only over the experts that received tokens (huggingface/transformers#38518,
https://github.com/huggingface/transformers/issues/38518; fix attempts in PRs #40114 and #46929).

Tiny Mixtral with `experts_implementation="eager"`: MixtralExperts.forward builds `expert_hit` with
`nonzero()` on the routing mask and runs a Python `for` over it, then `torch.where(expert_mask[i])` and
`index_add_`. The loop length is data-dependent. (transformers 5.24 defaults to "grouped_mm", which does not
loop; the report's pattern is the eager path.)

Expected: eager logits (1, 6, 128) of a 6-token prompt, no cache.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import MixtralConfig, MixtralForCausalLM


def build():
    torch.manual_seed(0)
    cfg = MixtralConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, num_local_experts=4,
                        num_experts_per_tok=2, use_cache=False)
    cfg._experts_implementation = "eager"
    model = MixtralForCausalLM(cfg).eval()
    inputs = {"input_ids": torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    with torch.no_grad():
        expected = model(**inputs).logits
    return model, inputs, expected

