"""C16: a decode step that takes a transformers DynamicCache as input and returns it in the output
(pytorch/pytorch#136582, pytorch/pytorch#148748: "Found DynamicCache in output/input, not a known type,
register a pytree").

Expected: eager logits of the one-token decode step after a 5-token prefill.
"""
import copy

import torch
from _tiny import tiny_llama


def build():
    model = tiny_llama()
    prompt = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values  # DynamicCache
    inputs = {"input_ids": torch.tensor([[7]]), "attention_mask": torch.ones(1, 6, dtype=torch.long),
              "past_key_values": cache}
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs)).logits
    return model, inputs, expected

