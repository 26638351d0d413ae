"""S42 (d14's kind): tiny DeepseekV2ForCausalLM, whose rotary embedding is complex in transformers 5.x.

``DeepseekV2RotaryEmbedding`` returns ``freqs_cis = torch.polar(ones, position_ids[..., None] * inv_freq)`` and
``apply_rotary_emb`` multiplies ``view_as_complex`` of the ``[batch, heads, seq, rope_dim]`` q/k rope parts by
``freqs_cis.unsqueeze(1)`` (heads-first, unlike Llama4), then ``view_as_real(...).flatten(3)``; multi-head latent
attention splits q/k into rope and no-rope parts. Dense MLP in every layer (``first_k_dense_replace``): the MoE
path is d01's kind, not this one.

Expected: eager logits (1, 6, 128). Static shapes: with a dynamic sequence, ExecuTorch's ``to_edge`` fixes the
sequence length to the traced one (``expand_kv``'s ``new_empty`` becomes ``empty.memory_format``, whose symbolic size
``MemoryFormatOpsPass`` turns into an int): not this kind; s40 and s41 cover complex RoPE with a dynamic sequence.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        torch.manual_seed(0)
        cfg = DeepseekV2Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, vocab_size=128, kv_lora_rank=16,
                               q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                               first_k_dense_replace=2, n_routed_experts=2, num_experts_per_tok=1,
                               max_position_embeddings=64, use_cache=False)
        _MODEL = DeepseekV2ForCausalLM(cfg).eval()
    return _MODEL


def _case(seq):
    model = _model()
    inputs = {"input_ids": torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(seq)),
              "attention_mask": torch.ones(1, seq, dtype=torch.long)}
    with torch.no_grad():
        return model, inputs, model(**inputs).logits


def build():
    return _case(6)


if __name__ == "__main__":
    print(build()[2].shape)
