"""S43 (d14's kind): tiny Llama4ForCausalLM (text only) with a dynamic sequence, batch 2 and a padded row.

Same complex rotary embedding as d14 (``torch.polar`` in ``Llama4TextRotaryEmbedding``, ``view_as_complex`` of
``[batch, seq, heads, head_dim/2]`` q/k times ``freqs_cis[:, :, None, :]``), but the sequence is a dynamic dim of
the program (the complex ``freqs_cis`` has a symbolic size), and the second row of the batch is left-padded.

Expected: eager logits (2, 5, 128); ALT_INPUTS: (2, 9, 128) with the same program.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from torch.export import Dim
from transformers import Llama4ForCausalLM, Llama4TextConfig

_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        torch.manual_seed(0)
        cfg = Llama4TextConfig(hidden_size=64, intermediate_size=64, intermediate_size_mlp=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                               max_position_embeddings=64, num_local_experts=2, num_experts_per_tok=1,
                               interleave_moe_layer_step=2, attention_chunk_size=32,
                               use_cache=False)
        _MODEL = Llama4ForCausalLM(cfg).eval()
    return _MODEL


def _case(seq):
    model = _model()
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, :2] = 0
    inputs = {"input_ids": torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(seq)),
              "attention_mask": mask}
    with torch.no_grad():
        return model, inputs, model(**inputs).logits


DYNAMIC_SHAPES = ({1: Dim("seq", min=3, max=32)}, {1: Dim("seq", min=3, max=32)})


def build():
    return _case(5)


def ALT_INPUTS():  # noqa: N802 - the field-case contract's name
    _, inputs, expected = _case(9)
    return inputs, expected


if __name__ == "__main__":
    print(build()[2].shape, ALT_INPUTS()[1].shape)
