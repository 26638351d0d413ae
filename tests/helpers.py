"""Seeded tiny Transformers models of the main families, built offline from small configs."""

import torch


def tiny_model(kind: str) -> torch.nn.Module:
    """A seeded tiny Transformers model of one architecture family."""
    import transformers as tf

    torch.manual_seed(0)
    if kind == "bert":
        cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                            vocab_size=100, max_position_embeddings=64)
        return tf.BertModel(cfg).eval()
    if kind == "llama":
        cfg = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=37, vocab_size=100, max_position_embeddings=64)
        return tf.LlamaForCausalLM(cfg).eval()
    if kind == "vit":
        cfg = tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                           image_size=32, patch_size=8)
        return tf.ViTModel(cfg).eval()
    if kind == "t5":
        cfg = tf.T5Config(d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2, num_heads=4,
                          vocab_size=100, decoder_start_token_id=0)
        return tf.T5ForConditionalGeneration(cfg).eval()
    if kind == "whisper":
        cfg = tf.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                               decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, vocab_size=100,
                               num_mel_bins=16, max_source_positions=16, max_target_positions=32,
                               decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                               suppress_tokens=None, begin_suppress_tokens=None)
        return tf.WhisperForConditionalGeneration(cfg).eval()
    raise KeyError(kind)
