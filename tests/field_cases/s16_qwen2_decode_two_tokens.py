"""S16 (sibling of C16): a two-token decode step of a tiny Qwen2 with a DynamicCache passed as ``cache`` (the
transformers 5 name of ``past_key_values``), after a 4-token prefill. Expected: eager logits.
"""
import copy

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def build():
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = Qwen2ForCausalLM(config).eval()
    prompt = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).cache
    inputs = {"input_ids": torch.tensor([[5, 9]]), "attention_mask": torch.ones(1, 6, dtype=torch.long),
              "cache": cache}
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs)).logits
    return model, inputs, expected
