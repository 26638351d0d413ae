"""S23 (sibling of D01): tiny OLMoE with ``experts_implementation="eager"`` (the ``nonzero()`` loop of D01
in another model family), top-3 of 6 experts, top-k weights not renormalised, one sequence of a dynamic
length (3 and 13 tokens). Expected: eager logits; also at the second length.
"""
import torch
from torch.export import Dim
from transformers import OlmoeConfig, OlmoeForCausalLM

SEQ = Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = ({1: SEQ}, {1: SEQ})


def _model():
    torch.manual_seed(0)
    config = OlmoeConfig(hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=128, max_position_embeddings=64, num_experts=6,
                         num_experts_per_tok=3, eos_token_id=2, use_cache=False)
    config._experts_implementation = "eager"
    return OlmoeForCausalLM(config).eval()


def _run(model, seq):
    inputs = {"input_ids": torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(seq)),
              "attention_mask": torch.ones(1, seq, dtype=torch.long)}
    with torch.no_grad():
        return inputs, model(**inputs).logits


def build():
    model = _model()
    inputs, expected = _run(model, 3)
    return model, inputs, expected


def ALT_INPUTS():
    return _run(_model(), 13)
