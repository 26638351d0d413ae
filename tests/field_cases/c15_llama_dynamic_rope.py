"""C15: RoPE whose frequencies depend on the runtime sequence length, `if max(position_ids)+1 > cached_len`
(pytorch/pytorch#163791, reported on Phi-3.5 longrope; the same Python branch remains in the "dynamic"
NTK rope of transformers' dynamic_rope_update). Tiny Llama with rope_type="dynamic".

Expected: eager logits for the 8-token prompt (shorter than max_position_embeddings, so no rescale).
"""
import torch
from _tiny import tiny_llama


def build():
    model = tiny_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    inputs = {"input_ids": torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    with torch.no_grad():
        expected = model(**inputs, use_cache=False).logits
    return model, inputs, expected

