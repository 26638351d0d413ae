"""S22 (sibling of D01): tiny Qwen2-MoE with transformers' default experts implementation (``grouped_mm``:
``aten.histc`` and the custom op ``transformers::grouped_mm_fallback``, the sweep's ONNX and ExecuTorch
failures), a shared expert beside the routed ones, top-2 of 4 without renormalisation, the token count
dynamic (batch 2 x a dynamic sequence). Expected: eager logits; also at a second sequence length.
"""
import torch
from torch.export import Dim
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

SEQ = Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = ({1: SEQ}, {1: SEQ})


def _model():
    torch.manual_seed(0)
    config = Qwen2MoeConfig(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                            shared_expert_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, num_experts=4,
                            num_experts_per_tok=2, norm_topk_prob=False, use_cache=False)
    model = Qwen2MoeForCausalLM(config).eval()
    assert model.config._experts_implementation == "grouped_mm", model.config._experts_implementation
    return model


def _run(model, seq):
    inputs = {"input_ids": torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(seq)),
              "attention_mask": torch.ones(2, seq, dtype=torch.long)}
    with torch.no_grad():
        return inputs, model(**inputs).logits


def build():
    model = _model()
    inputs, expected = _run(model, 5)
    return model, inputs, expected


def ALT_INPUTS():
    return _run(_model(), 9)
