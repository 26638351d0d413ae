"""S15 (sibling of C15): dynamic NTK RoPE on a tiny Qwen2, prompt LONGER than max_position_embeddings, so the
scaled frequencies are the ones in use (C15 only covers the unscaled branch). Expected: eager logits of a
freshly built model (no growth cache from earlier calls).
"""
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def build():
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=16,
                         rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})
    model = Qwen2ForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(2)),
              "attention_mask": torch.ones(1, 24, dtype=torch.long)}
    with torch.no_grad():
        fresh = Qwen2ForCausalLM(config).eval()
        fresh.load_state_dict(model.state_dict())
        expected = fresh(**inputs, use_cache=False).logits
    return model, inputs, expected
