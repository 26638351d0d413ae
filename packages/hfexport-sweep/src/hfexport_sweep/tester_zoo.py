"""The second zoo: architectures built as Transformers' own model testers build them.

Each case of ``hfexport sweep --zoo testers`` is one model class built from the config and the inputs that its
upstream model tester uses (``tests/models/<name>/test_modeling_<name>.py`` in huggingface/transformers: the
tester's ``__init__`` defaults, ``get_config()`` and ``prepare_config_and_inputs_for_common()``). This module is
our own registry of those facts — config values, batch, sequence length, image size, which inputs and how they
are drawn — not the testers' code. Where many testers share one base (``CausalLMModelTester`` in
``tests/causal_lm_tester.py``: batch 13, 7 tokens, vocab 99, hidden 32, 2 layers, 2 heads, a lower-triangular
attention mask), the shared facts are written once (:data:`CAUSAL_LM`).

Every case is checked at two shapes: the tester's (``inputs``) and a second one (``alt_inputs``): batch + 1 and
another sequence length (:data:`ALT_TOKENS` more tokens, :data:`ALT_SAMPLES` more audio samples), and an image
twice the tester's size where the model takes other sizes (CNNs, Swin, DINOv2, SegFormer). Where the model
takes one length only (Whisper's and AST's spectrogram frames, ViT-style position tables), only the batch moves;
:attr:`TesterCase.second_shape` says which.

The inputs follow the testers' recipes, drawn from a generator seeded with :data:`SEED` (the testers draw from
an unseeded RNG): ``ids_tensor`` (uniform token ids), ``random_attention_mask`` (0/1 with the last column 1),
``floats_tensor`` (uniform in [0, 1)), ``torch.tril`` masks of ``CausalLMModelTester``, BART's ``clamp(3)`` with
an EOS at the end and ``ne(pad)`` masks, CLIP's right-padded masks from a random start.

Nothing touches the network: configs come from the registry, weights are drawn after ``torch.manual_seed(0)``.
A case whose config, model or eager forward fails is reported ``not_instantiable`` with its reason, never dropped.

Example::

    from hfexport_sweep.tester_zoo import build_case, list_cases

    model, inputs, alt_inputs = build_case("gpt2/GPT2LMHeadModel")   # batch 13 x 7 tokens, then 14 x 12
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .zoo import NotInstantiable, UnknownCaseError, ZooCase

__all__ = ["ALT_SAMPLES", "ALT_TOKENS", "CAUSAL_LM", "SEED", "TESTERS", "TesterCase", "build_case", "get_case",
           "list_cases", "tester"]

SEED = 0
"""Seed of the weights (``torch.manual_seed``) and of the inputs' generator."""
ALT_TOKENS = 5
"""The second shape's extra tokens (7 -> 12 for most text testers)."""
ALT_SAMPLES = 576
"""The second shape's extra raw audio samples (1024 -> 1600 for the wav2vec2-style testers)."""

# Family (for the report) -> the zoo modality of its cases.
FAMILIES = {"decoder": "text", "encoder": "text", "encoder-decoder": "text2text", "vision": "vision",
            "audio": "audio", "speech": "speech", "multimodal": "multimodal", "dual-encoder": "dual-encoder",
            "ssm": "text"}


@dataclass(frozen=True)
class TesterCase:
    """One architecture as its upstream model tester builds it.

    Attributes:
        case_id: ``"<model_type>/<ClassName>"``.
        family: ``decoder``, ``encoder``, ``encoder-decoder``, ``vision``, ``audio``, ``speech``, ``multimodal``,
            ``dual-encoder`` or ``ssm``.
        config: the config class's keyword arguments (the tester's ``get_config()``); nested dicts for sub-configs.
        inputs: input name -> recipe (see :func:`_draw`), in the order the tester's dict has them.
        batch: the tester's batch size.
        seq: tokens (text), samples (raw audio) or frames (spectrograms) of the tester's inputs.
        decoder_seq: decoder tokens of an encoder-decoder tester (``None``: ``seq``).
        image: the tester's image side (pixels), ``None`` without images.
        alt_seq: the second shape's ``seq`` (``None``: the same: the model takes one length).
        alt_image: the second shape's image side (``None``: the same).
        filter_config: keep only the config keys the config class's ``__init__`` names (what
            ``CausalLMModelTester.get_config`` does), rather than passing every key.
        source: the tester file, relative to the transformers repository.
    """

    case_id: str
    family: str
    config: Mapping[str, Any]
    inputs: Mapping[str, str]
    batch: int = 13
    seq: int = 7
    decoder_seq: int | None = None
    image: int | None = None
    alt_seq: int | None = None
    alt_image: int | None = None
    filter_config: bool = False
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def model_type(self) -> str:
        """The ``transformers`` model type (the case id's first part)."""
        return self.case_id.split("/")[0]

    @property
    def class_name(self) -> str:
        """The model class (the case id's second part)."""
        return self.case_id.split("/")[1]

    @property
    def second_shape(self) -> str:
        """What the second shape changes: ``"batch 14, 12 tokens"``, ``"batch 14, image 64"`` ..."""
        parts = [f"batch {self.batch + 1}"]
        unit = {"audio": "samples", "speech": "frames"}.get(self.family, "tokens")
        if self.alt_seq is not None and self.alt_seq != self.seq:
            parts.append(f"{self.alt_seq} {unit}")
        if self.alt_image is not None and self.alt_image != self.image:
            parts.append(f"image {self.alt_image}")
        return ", ".join(parts)


# --------------------------------------------------------------------------- shared tester facts

CAUSAL_LM: dict[str, Any] = {
    "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    "intermediate_size": 37, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 16, "initializer_range": 0.02, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2, "is_decoder": False, "head_dim": 16, "moe_intermediate_size": 12,
    "shared_expert_intermediate_size": 36, "num_experts_per_tok": 2, "num_experts": 8,
}
"""``CausalLMModelTester``'s defaults (``tests/causal_lm_tester.py``), filtered per config class by its signature."""

_BERTISH = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 37, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 16,
            "initializer_range": 0.02}
_BART = {"vocab_size": 99, "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
         "decoder_attention_heads": 4, "encoder_ffn_dim": 4, "decoder_ffn_dim": 4, "dropout": 0.1,
         "attention_dropout": 0.1, "max_position_embeddings": 50, "eos_token_id": 2, "pad_token_id": 1,
         "bos_token_id": 0}
_T5 = {"vocab_size": 99, "d_model": 32, "d_ff": 37, "d_kv": 8, "num_layers": 5, "num_heads": 4,
       "relative_attention_num_buckets": 8, "dropout_rate": 0.1, "initializer_factor": 0.002, "eos_token_id": 1,
       "bos_token_id": 0, "pad_token_id": 0, "decoder_start_token_id": 0}
_W2V2 = {"hidden_size": 16, "feat_extract_norm": "group", "feat_extract_dropout": 0.0,
         "feat_extract_activation": "gelu", "conv_dim": (32, 32, 32), "conv_stride": (4, 4, 4),
         "conv_kernel": (8, 8, 8), "conv_bias": False, "num_conv_pos_embeddings": 16,
         "num_conv_pos_embedding_groups": 2, "num_hidden_layers": 2, "num_attention_heads": 2,
         "hidden_dropout_prob": 0.1, "intermediate_size": 20, "layer_norm_eps": 1e-5, "hidden_act": "gelu",
         "initializer_range": 0.02, "mask_time_prob": 0.5, "mask_time_length": 2, "vocab_size": 32}
_VIT = {"image_size": 30, "patch_size": 2, "num_channels": 3, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 37, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
_CLIP_TEXT = {"vocab_size": 99, "hidden_size": 32, "projection_dim": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 37, "dropout": 0.1, "attention_dropout": 0.1,
              "max_position_embeddings": 512, "initializer_range": 0.02}
_CLIP_VISION = {"image_size": 30, "patch_size": 2, "num_channels": 3, "hidden_size": 32, "projection_dim": 32,
                "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37, "dropout": 0.1,
                "attention_dropout": 0.1, "initializer_range": 0.02}
_CONVNEXT = {"num_channels": 3, "num_stages": 4, "hidden_sizes": [10, 20, 30, 40], "depths": [2, 2, 3, 2],
             "hidden_act": "gelu", "num_labels": 10, "initializer_range": 0.02,
             "out_features": ["stage2", "stage3", "stage4"], "out_indices": [2, 3, 4]}
_RESNET = {"num_channels": 3, "embedding_size": 10, "hidden_sizes": [10, 20, 30, 40], "depths": [1, 1, 2, 1],
           "hidden_act": "relu", "num_labels": 3}
_MAMBA = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 32,
          "hidden_act": "silu", "use_cache": True, "bos_token_id": 98, "eos_token_id": 98, "pad_token_id": 98,
          "tie_word_embeddings": True}

# Input recipes (see _draw).
_TEXT_CAUSAL = {"input_ids": "ids", "attention_mask": "tril"}
_TEXT_BERT = {"input_ids": "ids", "token_type_ids": "types", "attention_mask": "random_mask"}
_TEXT_MASK = {"input_ids": "ids", "attention_mask": "random_mask"}
_TEXT_TT_HEAD = {"input_ids": "ids", "token_type_ids": "types", "head_mask": "head_mask"}
_SEQ2SEQ_BART = {"input_ids": "ids_eos", "decoder_input_ids": "decoder_ids", "attention_mask": "ne_pad",
                 "decoder_attention_mask": "ne_pad"}
_SEQ2SEQ_T5 = {"input_ids": "ids", "attention_mask": "ids2", "decoder_input_ids": "decoder_ids",
               "decoder_attention_mask": "decoder_ids2"}
_AUDIO = {"input_values": "samples", "attention_mask": "random_mask"}
_PIXELS = {"pixel_values": "pixels"}


def tester(case_id: str, family: str, config: Mapping[str, Any], inputs: Mapping[str, str], *,
           source: str | None = None, **facts: Any) -> TesterCase:
    """A registry entry; the second shape defaults by family: text and SSMs take ``seq + ALT_TOKENS`` tokens,
    raw audio ``seq + ALT_SAMPLES`` samples; images and spectrogram frames keep their size unless given."""
    if "alt_seq" not in facts:
        seq = facts.get("seq", 7)
        facts["alt_seq"] = {"audio": seq + ALT_SAMPLES, "vision": None, "speech": None}.get(family, seq + ALT_TOKENS)
    name = case_id.split("/")[0].replace("-", "_")
    return TesterCase(case_id, family, dict(config), dict(inputs), source=source or
                      f"tests/models/{name}/test_modeling_{name}.py", **facts)


def _causal(case_id: str, inputs: Mapping[str, str] = _TEXT_CAUSAL, **overrides: Any) -> TesterCase:
    return tester(case_id, "decoder", {**CAUSAL_LM, **overrides}, inputs, filter_config=True)


TESTERS: tuple[TesterCase, ...] = (
    # ── decoders: CausalLMModelTester and the testers of their own ──────────────────────────────────────
    _causal("gpt2/GPT2LMHeadModel", {"input_ids": "ids", "token_type_ids": "types", "head_mask": "head_mask"},
            scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False),
    _causal("llama/LlamaForCausalLM"),
    _causal("mistral/MistralForCausalLM"),
    _causal("mixtral/MixtralForCausalLM"),
    _causal("qwen2/Qwen2ForCausalLM"),
    _causal("qwen2_moe/Qwen2MoeForCausalLM"),
    _causal("qwen3/Qwen3ForCausalLM"),
    _causal("qwen3_moe/Qwen3MoeForCausalLM"),
    _causal("gemma/GemmaForCausalLM"),
    _causal("gemma2/Gemma2ForCausalLM"),
    _causal("phi/PhiForCausalLM"),
    _causal("phi3/Phi3ForCausalLM"),
    _causal("falcon/FalconForCausalLM"),
    _causal("gpt_neox/GPTNeoXForCausalLM"),
    _causal("starcoder2/Starcoder2ForCausalLM"),
    _causal("stablelm/StableLmForCausalLM"),
    _causal("olmo/OlmoForCausalLM"),
    _causal("olmo2/Olmo2ForCausalLM"),
    _causal("granite/GraniteForCausalLM"),
    _causal("cohere/CohereForCausalLM"),
    _causal("llama/LlamaForSequenceClassification", {"input_ids": "ids", "attention_mask": "ne_one"}),
    tester("opt/OPTForCausalLM", "decoder",
           {"vocab_size": 99, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 4,
            "activation_function": "gelu", "dropout": 0.1, "attention_dropout": 0.1, "max_position_embeddings": 20,
            "eos_token_id": 2, "pad_token_id": 1, "bos_token_id": 0, "embed_dim": 16, "word_embed_proj_dim": 16},
           {"input_ids": "ids_eos", "attention_mask": "ne_pad"}),
    tester("bloom/BloomForCausalLM", "decoder",
           {"vocab_size": 99, "hidden_size": 32, "n_layer": 2, "n_head": 4, "hidden_dropout": 0.1,
            "attention_dropout": 0.1, "initializer_range": 0.02, "bos_token_id": 98, "eos_token_id": 98,
            "pad_token_id": 98}, {"input_ids": "ids"}, batch=14),
    tester("gptj/GPTJForCausalLM", "decoder",
           {"vocab_size": 99, "n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4, "n_inner": None,
            "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "n_positions": 512, "initializer_range": 0.02, "bos_token_id": 98, "eos_token_id": 98,
            "pad_token_id": 98}, _TEXT_TT_HEAD, batch=14),
    tester("codegen/CodeGenForCausalLM", "decoder",
           {"vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4, "n_inner": None,
            "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "n_positions": 512, "n_ctx": 512, "initializer_range": 0.02, "bos_token_id": 255,
            "eos_token_id": 255, "pad_token_id": 255}, _TEXT_TT_HEAD, batch=14),
    tester("gpt_neo/GPTNeoForCausalLM", "decoder",
           {"vocab_size": 99, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "max_position_embeddings": 512,
            "attention_types": [[["global", "local"], 1]], "window_size": 7, "use_cache": True,
            "bos_token_id": 98, "eos_token_id": 98, "pad_token_id": 98}, _TEXT_TT_HEAD, batch=14),
    tester("biogpt/BioGptForCausalLM", "decoder", {**_BERTISH, "num_hidden_layers": 2},
           {"input_ids": "ids", "attention_mask": "random_mask"}),
    # ── encoders ──────────────────────────────────────────────────────────────────────────────────────
    tester("bert/BertModel", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT),
    tester("bert/BertForMaskedLM", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT),
    tester("roberta/RobertaForSequenceClassification", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT),
    tester("distilbert/DistilBertForQuestionAnswering", "encoder",
           {"vocab_size": 99, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 37, "activation": "gelu",
            "dropout": 0.1, "attention_dropout": 0.1, "max_position_embeddings": 512, "initializer_range": 0.02},
           _TEXT_MASK),
    tester("albert/AlbertModel", "encoder",
           {**_BERTISH, "embedding_size": 16, "hidden_size": 36, "num_attention_heads": 6, "num_hidden_groups": 1},
           _TEXT_BERT),
    tester("electra/ElectraForTokenClassification", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT),
    tester("deberta/DebertaModel", "encoder",
           {**_BERTISH, "relative_attention": False, "position_biased_input": True, "pos_att_type": None},
           _TEXT_BERT),
    tester("deberta-v2/DebertaV2ForMaskedLM", "encoder",
           {**_BERTISH, "relative_attention": False, "position_biased_input": True, "pos_att_type": None},
           _TEXT_BERT),
    tester("mpnet/MPNetModel", "encoder",
           {"vocab_size": 99, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "initializer_range": 0.02},
           _TEXT_MASK),
    tester("modernbert/ModernBertModel", "encoder",
           {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 37, "hidden_activation": "gelu", "mlp_dropout": 0.0, "attention_dropout": 0.0,
            "embedding_dropout": 0.0, "classifier_dropout": 0.0, "max_position_embeddings": 512,
            "pad_token_id": 0, "initializer_range": 0.02}, _TEXT_MASK),
    tester("convbert/ConvBertModel", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT),
    tester("roformer/RoFormerModel", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT),
    tester("ernie/ErnieModel", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT),
    tester("megatron-bert/MegatronBertModel", "encoder",
           {**_BERTISH, "hidden_size": 64, "embedding_size": 32, "is_decoder": False}, _TEXT_BERT),
    tester("squeezebert/SqueezeBertModel", "encoder",
           {**_BERTISH, "q_groups": 2, "k_groups": 2, "v_groups": 2, "post_attention_groups": 2,
            "intermediate_groups": 4, "output_groups": 1, "embedding_size": 32, "intermediate_size": 64}, _TEXT_MASK),
    tester("xlm-roberta/XLMRobertaForMaskedLM", "encoder", {**_BERTISH, "is_decoder": False}, _TEXT_BERT,
           source="tests/models/xlm_roberta/test_modeling_xlm_roberta.py (the RoBERTa tester)"),
    # ── encoder-decoders ──────────────────────────────────────────────────────────────────────────────
    tester("t5/T5ForConditionalGeneration", "encoder-decoder", _T5, _SEQ2SEQ_T5, decoder_seq=9),
    tester("t5/T5Model", "encoder-decoder", _T5, _SEQ2SEQ_T5, decoder_seq=9),
    tester("mt5/MT5ForConditionalGeneration", "encoder-decoder", _T5, _SEQ2SEQ_T5, decoder_seq=9),
    tester("umt5/UMT5ForConditionalGeneration", "encoder-decoder", _T5, _SEQ2SEQ_T5, decoder_seq=9),
    tester("bart/BartForConditionalGeneration", "encoder-decoder", _BART, _SEQ2SEQ_BART),
    tester("bart/BartModel", "encoder-decoder", _BART, _SEQ2SEQ_BART),
    tester("mbart/MBartForConditionalGeneration", "encoder-decoder", {**_BART, "max_position_embeddings": 100},
           _SEQ2SEQ_BART),
    tester("marian/MarianMTModel", "encoder-decoder",
           {**_BART, "max_position_embeddings": 20, "decoder_start_token_id": 3}, _SEQ2SEQ_BART),
    tester("pegasus/PegasusForConditionalGeneration", "encoder-decoder",
           {**_BART, "max_position_embeddings": 20}, _SEQ2SEQ_BART),
    tester("m2m_100/M2M100ForConditionalGeneration", "encoder-decoder",
           {**_BART, "max_position_embeddings": 20, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
            "activation_function": "relu"}, _SEQ2SEQ_BART),
    tester("blenderbot/BlenderbotForConditionalGeneration", "encoder-decoder",
           {**_BART, "max_position_embeddings": 50}, _SEQ2SEQ_BART),
    tester("blenderbot-small/BlenderbotSmallForConditionalGeneration", "encoder-decoder",
           {**_BART, "max_position_embeddings": 50}, _SEQ2SEQ_BART,
           source="tests/models/blenderbot_small/test_modeling_blenderbot_small.py"),
    tester("plbart/PLBartForConditionalGeneration", "encoder-decoder",
           {**_BART, "max_position_embeddings": 100}, _SEQ2SEQ_BART),
    # ── vision ────────────────────────────────────────────────────────────────────────────────────────
    tester("vit/ViTForImageClassification", "vision", {**_VIT, "encoder_stride": 2}, _PIXELS, image=30),
    tester("vit/ViTModel", "vision", {**_VIT, "encoder_stride": 2}, _PIXELS, image=30),
    tester("deit/DeiTModel", "vision", {**_VIT, "encoder_stride": 2}, _PIXELS, image=30),
    tester("beit/BeitForImageClassification", "vision",
           {**_VIT, "vocab_size": 100, "num_hidden_layers": 4, "out_indices": [1, 2, 3, 4]}, _PIXELS, image=30),
    tester("dinov2/Dinov2Model", "vision", {**_VIT}, _PIXELS, image=30, alt_image=60),
    tester("convnext/ConvNextForImageClassification", "vision", _CONVNEXT, _PIXELS, image=32, alt_image=64),
    tester("convnextv2/ConvNextV2Model", "vision", _CONVNEXT, _PIXELS, image=32, alt_image=64),
    tester("resnet/ResNetForImageClassification", "vision", {**_RESNET, "out_features": ["stage2", "stage3", "stage4"],
           "out_indices": [2, 3, 4]}, _PIXELS, batch=3, image=32, alt_image=64),
    tester("regnet/RegNetModel", "vision", _RESNET, _PIXELS, batch=3, image=32, alt_image=64),
    tester("swin/SwinModel", "vision",
           {"image_size": 32, "patch_size": 2, "num_channels": 3, "embed_dim": 16, "depths": [1, 2, 1],
            "num_heads": [2, 2, 4], "window_size": 2, "mlp_ratio": 2.0, "qkv_bias": True, "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0, "drop_path_rate": 0.1, "hidden_act": "gelu",
            "use_absolute_embeddings": False, "patch_norm": True, "initializer_range": 0.02,
            "layer_norm_eps": 1e-5, "encoder_stride": 8, "out_features": ["stage1", "stage2"],
            "out_indices": [1, 2]}, _PIXELS, image=32, alt_image=64),
    tester("mobilenet_v2/MobileNetV2ForImageClassification", "vision",
           {"num_channels": 3, "image_size": 32, "depth_multiplier": 0.25, "depth_divisible_by": 8, "min_depth": 8,
            "expand_ratio": 6, "output_stride": 32, "first_layer_is_expansion": True, "finegrained_output": True,
            "hidden_act": "relu6", "classifier_dropout_prob": 0.1, "initializer_range": 0.02, "num_labels": 10},
           _PIXELS, image=32, alt_image=64),
    tester("segformer/SegformerForSemanticSegmentation", "vision",
           {"image_size": 64, "num_channels": 3, "num_encoder_blocks": 4, "depths": [1, 1, 1, 1],
            "sr_ratios": [8, 4, 2, 1], "hidden_sizes": [8, 8, 16, 16], "downsampling_rates": [1, 4, 8, 16],
            "num_attention_heads": [1, 1, 2, 2], "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02, "num_labels": 3}, _PIXELS,
           image=64, alt_image=128),
    tester("poolformer/PoolFormerModel", "vision",
           {"image_size": 64, "num_channels": 3, "num_encoder_blocks": 4, "depths": [2, 2, 2, 2],
            "hidden_sizes": [16, 32, 64, 128], "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "initializer_range": 0.02}, _PIXELS, image=64, alt_image=128),
    tester("levit/LevitForImageClassification", "vision",
           {"image_size": 64, "num_channels": 3, "kernel_size": 3, "stride": 2, "padding": 1, "patch_size": 16,
            "hidden_sizes": [16, 32, 48], "num_attention_heads": [1, 2, 3], "depths": [2, 3, 4],
            "key_dim": [8, 8, 8], "drop_path_rate": 0, "mlp_ratio": [2, 2, 2], "attention_ratio": [2, 2, 2],
            "initializer_range": 0.02, "num_labels": 2,
            "down_ops": [["Subsample", 8, 2, 4, 2, 2], ["Subsample", 8, 4, 4, 2, 2]]}, _PIXELS, image=64),
    tester("mobilevit/MobileViTModel", "vision",
           {"image_size": 32, "patch_size": 2, "num_channels": 3, "hidden_act": "silu", "conv_kernel_size": 3,
            "output_stride": 32, "hidden_sizes": [12, 16, 20], "neck_hidden_sizes": [16, 8, 8, 8, 8, 8, 8],
            "num_attention_heads": 4, "classifier_dropout_prob": 0.1, "initializer_range": 0.02}, _PIXELS,
           image=32, alt_image=64),
    # ── audio (raw samples) ───────────────────────────────────────────────────────────────────────────
    tester("wav2vec2/Wav2Vec2ForCTC", "audio",
           {**_W2V2, "do_stable_layer_norm": False, "num_adapter_layers": 1, "adapter_stride": 2,
            "tdnn_dim": (32, 32), "tdnn_kernel": (5, 3), "tdnn_dilation": (1, 2), "xvector_output_dim": 32},
           _AUDIO, seq=1024),
    tester("wav2vec2/Wav2Vec2Model", "audio",
           {**_W2V2, "do_stable_layer_norm": False, "num_adapter_layers": 1, "adapter_stride": 2}, _AUDIO, seq=1024),
    tester("hubert/HubertModel", "audio", {**_W2V2, "do_stable_layer_norm": False}, _AUDIO, seq=1024),
    tester("wavlm/WavLMModel", "audio",
           {**_W2V2, "do_stable_layer_norm": False, "num_buckets": 320, "max_bucket_distance": 800,
            "tdnn_dim": (32, 32), "tdnn_kernel": (3, 3), "tdnn_dilation": (1, 1), "xvector_output_dim": 32},
           _AUDIO, seq=1024),
    tester("data2vec-audio/Data2VecAudioModel", "audio",
           {**_W2V2, "feat_extract_norm": None, "num_conv_pos_embeddings": 5, "num_adapter_layers": 1,
            "adapter_stride": 2}, _AUDIO, seq=1024,
           source="tests/models/data2vec/test_modeling_data2vec_audio.py"),
    tester("sew/SEWModel", "audio",
           {**_W2V2, "hidden_size": 32, "conv_dim": (64, 32, 32), "conv_stride": (5, 2, 1),
            "conv_kernel": (10, 3, 1), "squeeze_factor": 2, "num_conv_pos_embeddings": 31}, _AUDIO, seq=1024),
    tester("unispeech/UniSpeechModel", "audio", {**_W2V2, "do_stable_layer_norm": False}, _AUDIO, seq=1024),
    tester("unispeech-sat/UniSpeechSatModel", "audio", {**_W2V2, "do_stable_layer_norm": False}, _AUDIO, seq=1024,
           source="tests/models/unispeech_sat/test_modeling_unispeech_sat.py"),
    tester("audio-spectrogram-transformer/ASTForAudioClassification", "audio",
           {"patch_size": 2, "max_length": 24, "num_mel_bins": 16, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 37, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02, "frequency_stride": 2,
            "time_stride": 2}, {"input_values": "spectrogram"}, seq=24, alt_seq=None,
           source="tests/models/audio_spectrogram_transformer/test_modeling_audio_spectrogram_transformer.py",
           extra={"mel_bins": 16}),
    # ── speech to text (spectrogram frames in, tokens out) ────────────────────────────────────────────
    tester("whisper/WhisperForConditionalGeneration", "speech",
           {"vocab_size": 200, "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "num_mel_bins": 80, "encoder_ffn_dim": 16, "decoder_ffn_dim": 16,
            "dropout": 0.1, "attention_dropout": 0.1, "max_source_positions": 30, "max_target_positions": 40,
            "bos_token_id": 98, "eos_token_id": 98, "pad_token_id": 0, "decoder_start_token_id": 85},
           {"input_features": "features", "decoder_input_ids": "decoder_start"}, batch=3, seq=60,
           extra={"mel_bins": 80}),
    tester("speech_to_text/Speech2TextForConditionalGeneration", "speech",
           {"vocab_size": 99, "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 4, "decoder_ffn_dim": 4, "num_conv_layers": 2,
            "conv_kernel_sizes": (5, 5), "conv_channels": 32, "input_feat_per_channel": 24, "input_channels": 1,
            "activation_function": "relu", "dropout": 0.1, "attention_dropout": 0.1,
            "max_source_positions": 20, "max_target_positions": 20, "eos_token_id": 2, "pad_token_id": 1,
            "bos_token_id": 0},
           {"input_features": "frames", "attention_mask": "ones_frames", "decoder_input_ids": "decoder_ids_2"},
           seq=7, alt_seq=12, extra={"mel_bins": 24}),
    # ── text and images ───────────────────────────────────────────────────────────────────────────────
    tester("clip/CLIPModel", "dual-encoder", {"text_config": _CLIP_TEXT, "vision_config": _CLIP_VISION,
                                             "projection_dim": 64},
           {"input_ids": "ids", "attention_mask": "right_padded", "pixel_values": "pixels"}, batch=12, image=30,
           extra={"vocab": 99}),
    tester("siglip/SiglipModel", "dual-encoder",
           {"text_config": {k: v for k, v in _CLIP_TEXT.items() if k != "projection_dim"},
            "vision_config": {k: v for k, v in _CLIP_VISION.items() if k != "projection_dim"}},
           {"input_ids": "ids", "pixel_values": "pixels"}, batch=12, image=30, extra={"vocab": 99}),
    tester("llava/LlavaForConditionalGeneration", "multimodal",
           {"text_config": {"model_type": "llama", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "intermediate_size": 37, "hidden_act": "gelu",
                            "max_position_embeddings": 512, "initializer_range": 0.02, "pad_token_id": 1},
            "vision_config": {"model_type": "clip_vision_model", "image_size": 8, "patch_size": 2,
                              "num_channels": 3, "hidden_size": 32, "projection_dim": 32, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "intermediate_size": 37, "dropout": 0.1,
                              "attention_dropout": 0.1, "initializer_range": 0.02},
            "ignore_index": -100, "image_token_index": 0, "projector_hidden_act": "gelu",
            "vision_feature_select_strategy": "default", "vision_feature_layer": -1},
           {"input_ids": "image_tokens", "attention_mask": "ne_one", "pixel_values": "pixels"}, batch=3, image=8,
           extra={"image_tokens": 16, "image_token": 0, "pad": 1},
           source="tests/models/llava/test_modeling_llava.py"),
    # ── state-space and recurrent models ──────────────────────────────────────────────────────────────
    tester("mamba/MambaForCausalLM", "ssm", {**_MAMBA, "n_positions": 512, "type_vocab_size": 16},
           {"input_ids": "ids", "attention_mask": "zeros"}, batch=14),
    tester("mamba/MambaModel", "ssm", {**_MAMBA, "n_positions": 512, "type_vocab_size": 16},
           {"input_ids": "ids", "attention_mask": "zeros"}, batch=14),
    tester("falcon_mamba/FalconMambaForCausalLM", "ssm", _MAMBA, {"input_ids": "ids", "attention_mask": "zeros"},
           batch=14),
    tester("mamba2/Mamba2ForCausalLM", "ssm",
           {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "expand": 2, "num_heads": 8,
            "head_dim": 8, "n_groups": 1, "state_size": 16, "conv_kernel": 4, "chunk_size": 8,
            "hidden_act": "silu", "use_cache": True, "bos_token_id": 98, "eos_token_id": 98, "pad_token_id": 98,
            "tie_word_embeddings": False}, {"input_ids": "ids"}, batch=14),
    tester("rwkv/RwkvForCausalLM", "ssm",
           {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 37,
            "attention_hidden_size": 32, "context_length": 512, "bos_token_id": 98, "eos_token_id": 98,
            "pad_token_id": 98}, {"input_ids": "ids"}, batch=14),
)


# --------------------------------------------------------------------------- listing

@functools.lru_cache(maxsize=1)
def _index() -> dict[str, TesterCase]:
    index: dict[str, TesterCase] = {}
    for case in TESTERS:
        if case.case_id in index:
            raise ValueError(f"tester zoo: {case.case_id} is registered twice")
        index[case.case_id] = case
    return dict(sorted(index.items()))


def _zoo_case(case: TesterCase) -> ZooCase:
    return ZooCase(case.case_id, case.model_type, case.class_name, task=f"tester:{case.family}",
                   modality=FAMILIES[case.family])


def list_cases(filter: str | None = None) -> list[ZooCase]:  # noqa: A002 - the zoo's API name
    """The tester zoo's cases as :class:`~hfexport_sweep.zoo.ZooCase` (``task`` is ``"tester:<family>"``), by id.

    Args:
        filter: a regular expression searched in each case id.

    Returns:
        The matching cases (every one has an input recipe).

    Raises:
        re.error: ``filter`` is not a regular expression.
    """
    cases = [_zoo_case(c) for c in _index().values()]
    if filter is not None:
        pattern = re.compile(filter)
        cases = [c for c in cases if pattern.search(c.case_id)]
    return cases


def get_case(case_id: str) -> TesterCase:
    """The registry entry of ``case_id``.

    Raises:
        UnknownCaseError: no such case in the tester zoo.
    """
    try:
        return _index()[case_id]
    except KeyError:
        raise UnknownCaseError(f"unknown tester-zoo case {case_id!r}: see hfexport_sweep.tester_zoo.list_cases()"
                               ) from None


# --------------------------------------------------------------------------- building

def _config(case: TesterCase) -> Any:
    from transformers import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[case.model_type]
    except KeyError as exc:
        raise NotInstantiable(f"transformers has no config for model type {case.model_type!r}") from exc
    kwargs = copy.deepcopy(dict(case.config))
    if case.filter_config:  # CausalLMModelTester: the names the config takes, its attribute_map's aliases too
        aliases = dict(getattr(config_class, "attribute_map", {}) or {})
        names = set(inspect.signature(config_class.__init__).parameters) | {"pad_token_id"}
        kwargs = {aliases.get(k, k): v for k, v in kwargs.items() if k in names or aliases.get(k) in names}
    try:
        return config_class(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the reason is the case's record
        raise NotInstantiable(f"the tester's config does not build: {type(exc).__name__}: {exc}") from exc


def _ints(gen: torch.Generator, shape: tuple[int, ...], high: int, low: int = 0) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=gen, dtype=torch.long)


def _floats(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=torch.float32)


def _draw(recipe: str, case: TesterCase, config: Any, batch: int, seq: int, image: int | None,
          gen: torch.Generator, drawn: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One input of a tester's recipe at ``batch`` x ``seq`` (image side ``image``), from ``gen``."""
    text = getattr(config, "text_config", None) or config
    vocab = int(case.extra.get("vocab", getattr(text, "vocab_size", 99) or 99))
    dec = (case.decoder_seq or seq) if case.decoder_seq is None or seq == case.seq else case.decoder_seq + ALT_TOKENS
    pad = getattr(text, "pad_token_id", None)
    draws: dict[str, Callable[[], torch.Tensor]] = {
        "ids": lambda: _ints(gen, (batch, seq), vocab),
        "types": lambda: _ints(gen, (batch, seq), int(getattr(config, "type_vocab_size", 16) or 16)),
        "random_mask": lambda: _ints(gen, (batch, seq), 2).index_fill_(1, torch.tensor([seq - 1]), 1),
        "tril": lambda: torch.tril(torch.ones(batch, seq, dtype=torch.long)),
        "ids2": lambda: _ints(gen, (batch, seq), 2),
        "zeros": lambda: torch.zeros(batch, seq, dtype=torch.long),
        "ones_frames": lambda: torch.ones(batch, seq, dtype=torch.long),
        "ne_pad": lambda: drawn["input_ids"].ne(pad).long(),
        "ne_one": lambda: drawn["input_ids"].ne(1).long(),
        "ids_eos": lambda: _ints(gen, (batch, seq), vocab).clamp(3).index_fill_(
            1, torch.tensor([seq - 1]), int(getattr(config, "eos_token_id", 2))),
        "decoder_ids": lambda: _ints(gen, (batch, dec), vocab),
        "decoder_ids2": lambda: _ints(gen, (batch, dec), 2),
        "decoder_ids_2": lambda: _ints(gen, (batch, seq), vocab).clamp(2),
        "decoder_start": lambda: torch.full((batch, 1), int(config.decoder_start_token_id), dtype=torch.long),
        "head_mask": lambda: _ints(gen, (int(getattr(config, "num_hidden_layers", 2)),
                                         int(getattr(config, "num_attention_heads", 4))), 2),
        "pixels": lambda: _floats(gen, (batch, 3, image, image)),
        "samples": lambda: _floats(gen, (batch, seq)),
        "features": lambda: _floats(gen, (batch, int(case.extra["mel_bins"]), seq)),
        "frames": lambda: _floats(gen, (batch, seq, int(case.extra["mel_bins"]))),
        "spectrogram": lambda: _floats(gen, (batch, seq, int(case.extra["mel_bins"]))),
    }
    if recipe == "right_padded":  # CLIP's text testers: ones up to a random start in [1, seq - 1), zeros after
        starts = _ints(gen, (batch,), seq - 1, low=1)
        return (torch.arange(seq).unsqueeze(0) < starts.unsqueeze(1)).long()
    if recipe == "image_tokens":  # LLaVA's tester: ids in [1, vocab), no stray image token, the image's first
        tokens, image_token = int(case.extra["image_tokens"]), int(case.extra["image_token"])
        ids = _ints(gen, (batch, seq + tokens), vocab - 1) + 1
        ids[ids == image_token] = int(case.extra["pad"])
        ids[:, :tokens] = image_token
        return ids
    try:
        return draws[recipe]()
    except KeyError:
        raise ValueError(f"tester zoo: unknown input recipe {recipe!r} in {case.case_id}") from None


def _inputs(case: TesterCase, config: Any, batch: int, seq: int, image: int | None,
            gen: torch.Generator) -> dict[str, Any]:
    drawn: dict[str, Any] = {}
    for name, recipe in case.inputs.items():
        drawn[name] = _draw(recipe, case, config, batch, seq, image, gen, drawn)
    return drawn


def build_case(case_id: str) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """Build a tester-zoo case: the model as its tester configures it, the tester's inputs, and the second shape's.

    The result is a pure function of ``case_id``: weights are drawn after ``torch.manual_seed(0)`` (the global
    RNG state is restored) and both input sets come from one generator seeded with 0.

    Args:
        case_id: ``"<model_type>/<ClassName>"`` as listed by :func:`list_cases`.

    Returns:
        ``(model, inputs, alt_inputs)``: the eval-mode float32 CPU model; forward kwargs at the tester's shape
        (``batch`` x ``seq``, image ``image``) and at the second shape (:attr:`TesterCase.second_shape`).
        Token ids are int64, masks int64 0/1, pixels and audio float32 in [0, 1).

    Raises:
        UnknownCaseError: not a tester-zoo case.
        NotInstantiable: the config or the model does not build.
    """
    import transformers

    case = get_case(case_id)
    config = _config(case)
    model_class = getattr(transformers, case.class_name, None)
    if model_class is None:
        raise NotInstantiable(f"transformers has no class {case.class_name}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        try:
            model = model_class(config)
        except Exception as exc:  # noqa: BLE001
            raise NotInstantiable(f"model construction fails: {type(exc).__name__}: {exc}") from exc
    model = model.float().eval()
    gen = torch.Generator().manual_seed(SEED)
    inputs = _inputs(case, config, case.batch, case.seq, case.image, gen)
    alt_inputs = _inputs(case, config, case.batch + 1, case.alt_seq if case.alt_seq is not None else case.seq,
                         case.alt_image if case.alt_image is not None else case.image, gen)
    return model, inputs, alt_inputs
