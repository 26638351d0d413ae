"""F11: a decode step of a hybrid short-convolution / attention model with its cache passed in (tiny
Lfm2ForCausalLM: one `conv` layer, one `full_attention` layer) (huggingface/transformers#39436,
https://github.com/huggingface/transformers/issues/39436, closed, 2025-07, "Export LFM2 to ExecuTorch": export
failed on data-dependent control flow in the conv layer's cached `slow_forward`; the serving side still breaks on
the conv-state write: openvinotoolkit/openvino.genai#4292, open, 2026-08, OpenVINO CPU `ScatterNDUpdate` from the
conv layer's `aten::index_put_` fails for LFM2.5).

A 7-token prefill fills the hybrid cache (a rolling conv state for the conv layer, keys/values for the attention
layer); the exported step takes one token plus that cache. The conv layer takes its single-token path (roll the
state, write the new column, dot with the kernel).

Expected: eager logits (1, 1, 128) of the decode step.
"""
import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import Lfm2Config, Lfm2ForCausalLM


def _model():
    torch.manual_seed(0)
    cfg = Lfm2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     layer_types=["conv", "full_attention"], attn_implementation="sdpa")
    return Lfm2ForCausalLM(cfg).eval()


def build():
    model = _model()
    prompt = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
    inputs = {"input_ids": torch.tensor([[11]]), "attention_mask": torch.ones(1, 8, dtype=torch.long),
              "past_key_values": cache, "use_cache": True}
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs)).logits
    return model, inputs, expected

