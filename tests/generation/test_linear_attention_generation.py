"""Hybrid decoders whose cache holds linear-attention states (transformers' ``LinearAttentionLayer``) beside the KV
cache, through ``task="text-generation"`` (issue 46): LFM2's conv layers carry their ``[batch, channels, kernel]``
state as the ``decoder`` program's input and output (``kv_cache.state_layer``), and greedy ``generate`` returns
eager ``model.generate(do_sample=False)``'s ids; what the program does not carry yet is refused naming it."""

from __future__ import annotations

import os

import pytest
import torch

import hfexport

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NEW_TOKENS = 12


def tiny_lfm2(kind: str = "lfm2") -> torch.nn.Module:
    """A tiny LFM2 (conv, full attention), or its siblings of the same conv-state cache: LFM2-MoE (experts after
    the conv layer) and LFM3 (conv, sliding and full attention)."""
    import transformers

    torch.manual_seed(0)  # initializer_range 0.3: the greedy ids vary (at 0.02 they repeat one token)
    common = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
              "num_key_value_heads": 1, "max_position_embeddings": 64, "conv_L_cache": 3, "initializer_range": 0.3,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    config, model_class = {
        "lfm2": (lambda: transformers.Lfm2Config(num_hidden_layers=2, layer_types=["conv", "full_attention"],
                                                 **common), transformers.Lfm2ForCausalLM),
        "lfm2_moe": (lambda: transformers.Lfm2MoeConfig(num_hidden_layers=2, layer_types=["conv", "full_attention"],
                                                        moe_intermediate_size=16, num_experts=4,
                                                        num_experts_per_tok=2, num_dense_layers=1, **common),
                     transformers.Lfm2MoeForCausalLM),
        "lfm3": (lambda: transformers.Lfm3Config(num_hidden_layers=3, sliding_window=32,
                                                 layer_types=["conv", "sliding_attention", "full_attention"],
                                                 **common), transformers.Lfm3ForCausalLM),
    }[kind]
    return model_class(config()).eval()


@pytest.mark.parametrize("backend,kind", [
    ("dynamo", "lfm2"), *(pytest.param(*case, marks=pytest.mark.slow)
                          for case in (("onnx", "lfm2"), ("dynamo", "lfm2_moe"), ("dynamo", "lfm3")))])
def test_lfm2_generates_eagers_ids(backend, kind):
    """One row and a batch whose second row is left-padded by 2, a prompt of 7 prefilled in chunks of 4, then
    decode steps of one token: the conv states go from call to call as the KV cache does. Before, planning failed
    on ``'LinearAttentionLayer' object has no attribute 'keys'``."""
    model = tiny_lfm2(kind)
    exported = hfexport.export(model, backend=backend, task="text-generation", max_cache_len=32, max_batch=2,
                               prefill_chunk=4)
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    ids[1, :2], mask[1, :2] = 0, 0
    for rows in (1, 2):
        with torch.no_grad():
            expected = model.generate(input_ids=ids[:rows], attention_mask=mask[:rows], do_sample=False,
                                      max_new_tokens=NEW_TOKENS)
        actual = exported.generate(ids[:rows], attention_mask=mask[:rows], max_new_tokens=NEW_TOKENS)
        assert torch.equal(actual, expected), (actual, expected)
        assert len(set(expected[0, 7:].tolist())) > 3  # not one repeated token


def test_a_runtime_held_cache_with_conv_states_is_refused_naming_the_layers():
    """The conv states ride as the program's inputs and outputs only: a backend that keeps the cache in the
    runtime (OpenVINO's growing variables) is refused before any trace, naming the layers."""
    with pytest.raises(hfexport.InvalidInputError, match=r"linear-attention states \(layers \[0\]\)"):
        hfexport.export(tiny_lfm2(), backend="openvino", task="text-generation", max_cache_len=32)
