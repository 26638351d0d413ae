"""The one tiny-model factory of the tests: seeded Transformers models built offline from small configs."""

from __future__ import annotations

from typing import Any

import torch

# kind -> (model class name, config class name, config kwargs). Sizes are tiny on purpose: 32 hidden units,
# 37 intermediate (not a multiple of anything, so no kernel gets a lucky shape), 100 tokens, 64 positions.
_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=100,
                max_position_embeddings=64)
_DECODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=37, vocab_size=100, max_position_embeddings=64)
_SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=37, decoder_ffn_dim=37, vocab_size=100)
KINDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("BertModel", "BertConfig", _ENCODER),
    "roberta": ("RobertaModel", "RobertaConfig", dict(_ENCODER, pad_token_id=1)),
    "distilbert": ("DistilBertModel", "DistilBertConfig", dict(dim=32, n_layers=2, n_heads=2, hidden_dim=37,
                                                               vocab_size=100, max_position_embeddings=64)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", _DECODER),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", _DECODER),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(_DECODER, sliding_window=None)),
    "phi": ("PhiForCausalLM", "PhiConfig", dict(_DECODER, num_key_value_heads=None)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=32, n_layer=2, n_head=2, n_inner=37, vocab_size=100,
                                                   n_positions=64, bos_token_id=1, eos_token_id=2)),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                                          num_decoder_layers=2, num_heads=4, vocab_size=100,
                                                          decoder_start_token_id=0)),
    "bart": ("BartForConditionalGeneration", "BartConfig", dict(_SEQ2SEQ, max_position_embeddings=64)),
    "bart-base": ("BartModel", "BartConfig", dict(_SEQ2SEQ, max_position_embeddings=64)),
    "vit": ("ViTModel", "ViTConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=37, image_size=32, patch_size=8)),
    "convnext": ("ConvNextModel", "ConvNextConfig", dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                                         num_channels=3, image_size=32)),
    "whisper": ("WhisperForConditionalGeneration", "WhisperConfig", dict(
        _SEQ2SEQ, num_mel_bins=16, max_source_positions=16, max_target_positions=32, decoder_start_token_id=1,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, suppress_tokens=None, begin_suppress_tokens=None)),
}
_LAYER_KEYS = ("num_hidden_layers", "n_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers",
               "decoder_layers")


def tiny_model(kind: str, *, layers: int | None = None, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A seeded tiny Transformers model of one architecture family, in eval mode.

    Args:
        kind: a key of :data:`KINDS` (``"bert"``, ``"llama"``, ``"t5"``, ...).
        layers: set every layer count of the config (1 halves lowering time where depth does not matter).
        seed: the ``torch.manual_seed`` the weights are drawn with.
        **overrides: config fields (``hidden_size=64``).

    Raises:
        KeyError: an unknown kind (the message lists the known ones).
    """
    import transformers as tf

    if kind not in KINDS:
        raise KeyError(f"unknown tiny model {kind!r}; known: {', '.join(KINDS)}")
    model_name, config_name, kwargs = KINDS[kind]
    kwargs = dict(kwargs)
    if layers is not None:
        kwargs.update({k: layers for k in _LAYER_KEYS if k in kwargs})
        if kind == "convnext":
            kwargs.update(hidden_sizes=kwargs["hidden_sizes"][:layers * 2], depths=[1] * layers * 2,
                          num_stages=layers * 2)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return getattr(tf, model_name)(getattr(tf, config_name)(**kwargs)).eval()
