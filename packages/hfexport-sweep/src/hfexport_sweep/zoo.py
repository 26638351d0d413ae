"""A tiny-model zoo built offline from ``transformers`` itself.

Every model class named in the ``transformers`` auto mappings (base models,
causal / masked LM, sequence-to-sequence, speech-to-text, classification
heads, ...) becomes a :class:`ZooCase` whose id is ``"<model_type>/<ClassName>"``
(for example ``"llama/LlamaForCausalLM"``).  :func:`build_case` rebuilds such a
case exactly from its id: the default config class of the model type is shrunk
to tiny sizes (hidden ~64, 2 layers, vocab 512, 64x64 images, ...), nested
text / vision / audio sub-configs included, the model is instantiated with
``torch.manual_seed(0)`` and put in eval mode, and two sets of dummy forward
kwargs are produced: ``inputs`` (batch 2) and ``alt_inputs`` (batch 3 and, where
the modality allows it, a different sequence length) for checking dynamic
exports. The sizes are realistic where it matters (:func:`case_shapes`): one case
per model type (the one ``sample_cases(0)`` draws) has batch 9 and 10, audio lasts
1 s and 1.25 s, and a vision case's images have its config's size. A multimodal case gets
one image (or audio clip) laid out as its processor would (:data:`MEDIA_KINDS`: plain ``pixel_values``,
``image_grid_thw``, ``image_sizes``, ``pixel_attention_mask``, ``spatial_shapes``, audio features) with its
placeholder tokens in the first row (GIT, ViLT: one image per row) where that runs eagerly, else text only; the
model's :func:`image_inputs` says which, and why.

Nothing here touches the network or the Hugging Face Hub: configs come from the
config classes' defaults and weights are randomly initialised.

A case whose tiny config, model construction or eager forward fails is never
dropped silently: :func:`build_case` raises :class:`NotInstantiable` with a
one-line reason and :func:`check_instantiable` returns that reason.

Example::

    from hfexport_sweep.zoo import build_case, list_cases

    for case in list_cases(r"^llama/"):
        model, inputs, alt_inputs = build_case(case.case_id)
        model(**inputs)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import math
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

# the zoo's sizes live where the CLI's help and the reports read them without importing torch
from .results import ALT_BATCH, ALT_LARGE_BATCH, ALT_SEQ_LEN, BATCH, LARGE_BATCH, SEQ_LEN

__all__ = [
    "ImageInputs",
    "MEDIA_KINDS",
    "NotInstantiable",
    "UnknownCaseError",
    "ZooCase",
    "build_case",
    "check_instantiable",
    "image_inputs",
    "list_cases",
    "case_shapes",
    "sample_cases",
    "tiny_config",
]

SEED = 0
"""Seed used for weights (``torch.manual_seed``) and dummy inputs."""

DECODER_SEQ_LEN, ALT_DECODER_SEQ_LEN = 6, 5
AUDIO_SECONDS, ALT_AUDIO_SECONDS = 1.0, 1.25
"""Raw audio (``input_values``) at ``config.sampling_rate`` (16 kHz when the config names none) and feature frames
(``input_features``, 100 a second) are this long at the traced and the alt shape; Whisper keeps its 2 x
``max_source_positions`` frames."""
ZOO_INPUTS_VERSION = 2
"""The version of the inputs :func:`build_case` makes, recorded in a sweep's ``meta.json``: results of other inputs
are not mixed in. 2: issue 26's realistic sizes (:func:`case_shapes`); 1: batch 2 and 3, 64x64 images, 1600 audio
samples."""
MAX_CONFIG_IMAGE = 512
"""A vision case keeps its config's ``image_size`` (and ``patch_size``) when no side exceeds this many pixels, and
gets 224-pixel images when the config names no size (CNNs); larger configs get :data:`TINY_IMAGE`."""

TINY_VOCAB = 512
TINY_HIDDEN = 64
TINY_HEADS = 4
TINY_LAYERS = 2
TINY_IMAGE = 64
TINY_PATCH = 8

# (task, mapping name in transformers.models.auto.modeling_auto). Order matters:
# a class listed in several mappings gets the task of the first one.
_TASK_MAPPINGS: tuple[tuple[str, str], ...] = (
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("sequence-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("token-classification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("question-answering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES"),
    ("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
    ("feature-extraction", "MODEL_MAPPING_NAMES"),
)

_TASK_MODALITY = {
    "causal-lm": "text",
    "masked-lm": "text",
    "sequence-classification": "text",
    "token-classification": "text",
    "question-answering": "text",
    "seq2seq-lm": "text2text",
    "speech-seq2seq": "speech",
    "image-classification": "vision",
    "ctc": "audio",
    "audio-classification": "audio",
}

# Model-type level modality, used for base models: first matching group wins.
_MODALITY_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("speech", ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",)),
    (
        "audio",
        (
            "MODEL_FOR_CTC_MAPPING_NAMES",
            "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_AUDIO_FRAME_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES",
        ),
    ),
    ("dual-encoder", ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",)),
    (
        "multimodal",
        (
            "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
            "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
            "MODEL_FOR_VISUAL_QUESTION_ANSWERING_MAPPING_NAMES",
            "MODEL_FOR_DOCUMENT_QUESTION_ANSWERING_MAPPING_NAMES",
        ),
    ),
    ("text2text", ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",)),
    (
        "text",
        (
            "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
            "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
            "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
        ),
    ),
    (
        "vision",
        (
            "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_IMAGE_MAPPING_NAMES",
            "MODEL_FOR_BACKBONE_MAPPING_NAMES",
            "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES",
            "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",
            "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
        ),
    ),
)

_MODALITIES = ("text", "text2text", "speech", "audio", "vision", "multimodal", "dual-encoder", "other")


class NotInstantiable(Exception):
    """A zoo case whose tiny config, model construction or eager forward fails.

    ``str(exc)`` (and :attr:`reason`) is a one-line reason.
    """

    def __init__(self, reason: str) -> None:
        """Store the one-line reason.

        Args:
            reason: Why the case cannot be instantiated; newlines are collapsed.
        """
        self.reason = " ".join(str(reason).split())
        super().__init__(self.reason)


class UnknownCaseError(LookupError):
    """Raised for a case id that is not listed by :func:`list_cases`."""


@dataclass(frozen=True)
class ZooCase:
    """One model class of the zoo.

    Attributes:
        case_id: ``"<model_type>/<ClassName>"``, e.g. ``"llama/LlamaForCausalLM"``.
        model_type: The ``transformers`` model type (key of ``CONFIG_MAPPING``).
        class_name: The model class name, an attribute of the ``transformers`` package.
        task: The task of the auto mapping it was enumerated from, e.g. ``"causal-lm"``,
            ``"feature-extraction"`` for base models.
        modality: The kind of dummy inputs it gets: ``"text"``, ``"text2text"``
            (encoder-decoder), ``"speech"``, ``"audio"``, ``"vision"``, ``"multimodal"``
            (text and, where the recipe works, an image: see :func:`image_inputs`),
            ``"dual-encoder"`` (text and image) or ``"other"`` (no input recipe; never instantiable).
    """

    case_id: str
    model_type: str
    class_name: str
    task: str
    modality: str


# --------------------------------------------------------------------------- listing


def _mapping_items(mapping: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for model_type, names in mapping.items():
        if isinstance(names, (list, tuple)):
            for name in names:
                yield model_type, name
        else:
            yield model_type, names


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, ZooCase]:
    from transformers.models.auto import modeling_auto

    def mapping(name: str) -> dict[str, Any]:
        return getattr(modeling_auto, name, {}) or {}

    type_modality: dict[str, str] = {}
    for modality, names in _MODALITY_GROUPS:
        for name in names:
            for model_type in mapping(name):
                type_modality.setdefault(model_type, modality)
    multimodal_classes = {cls for name in _MODALITY_GROUPS[3][1] for _, cls in _mapping_items(mapping(name))}

    cases: dict[str, ZooCase] = {}
    for task, name in _TASK_MAPPINGS:
        for model_type, class_name in _mapping_items(mapping(name)):
            case_id = f"{model_type}/{class_name}"
            if case_id in cases:
                continue
            if task == "feature-extraction":
                modality = type_modality.get(model_type, "other")
            else:
                modality = _TASK_MODALITY[task]
                if modality == "text" and class_name in multimodal_classes:
                    modality = "multimodal"
            cases[case_id] = ZooCase(case_id, model_type, class_name, task, modality)
    return dict(sorted(cases.items()))


def list_cases(filter: str | None = None) -> list[ZooCase]:  # noqa: A002 - public API name
    """List the zoo cases, sorted by id, without building any model.

    Args:
        filter: Optional regular expression; only cases whose ``case_id`` matches it
            (``re.search``) are returned.

    Returns:
        The matching cases.
    """
    cases = list(_index().values())
    if filter is not None:
        pattern = re.compile(filter)
        cases = [c for c in cases if pattern.search(c.case_id)]
    return cases


def sample_cases(seed: int = 0) -> list[ZooCase]:
    """A seeded sample of the zoo: one case per model type (family), sorted by id.

    For every model type with at least one case that has an input recipe (modality other than ``"other"``,
    which is never instantiable), one such case is drawn by ``random.Random(f"hfexport-sweep-sample:{seed}:
    {model_type}")`` from its candidates sorted by id. The choice is a pure function of ``seed``, the model
    type and its classes in the installed ``transformers``: the same on every run and machine, and a family's
    choice does not move when other families are added. Model types whose cases all lack an input recipe are
    left out.

    Args:
        seed: the sample's seed (``hfexport sweep --sample --seed N``).

    Returns:
        One :class:`ZooCase` per sampled model type (448 with transformers 5.x at the time of writing).
    """
    families: dict[str, list[ZooCase]] = {}
    for case in _index().values():
        if case.modality != "other":
            families.setdefault(case.model_type, []).append(case)
    return sorted((random.Random(f"hfexport-sweep-sample:{seed}:{model_type}").choice(sorted(
        candidates, key=lambda c: c.case_id)) for model_type, candidates in families.items()),
        key=lambda c: c.case_id)


def get_case(case_id: str) -> ZooCase:
    """Look a case up by id.

    Args:
        case_id: ``"<model_type>/<ClassName>"``.

    Returns:
        The case.

    Raises:
        UnknownCaseError: If no such case is listed.
    """
    try:
        return _index()[case_id]
    except KeyError:
        raise UnknownCaseError(
            f"unknown zoo case {case_id!r}: expected '<model_type>/<ClassName>' as listed by list_cases()"
        ) from None


# --------------------------------------------------------------------------- tiny configs

# Integer size fields clamped to ``min(default, target)``.
_INT_CAPS: dict[str, int] = {
    # transformer widths / depths
    "hidden_size": TINY_HIDDEN,
    "d_model": TINY_HIDDEN,
    "n_embd": TINY_HIDDEN,
    "dim": TINY_HIDDEN,
    "embed_dim": 32,
    "word_embed_proj_dim": TINY_HIDDEN,
    "embedding_size": 32,
    "embedding_dim": TINY_HIDDEN,
    "intermediate_size": 2 * TINY_HIDDEN,
    "ffn_dim": 2 * TINY_HIDDEN,
    "encoder_ffn_dim": 2 * TINY_HIDDEN,
    "decoder_ffn_dim": 2 * TINY_HIDDEN,
    "d_ff": 2 * TINY_HIDDEN,
    "n_inner": 2 * TINY_HIDDEN,
    "hidden_dim": 2 * TINY_HIDDEN,
    "mlp_dim": 2 * TINY_HIDDEN,
    "num_hidden_layers": TINY_LAYERS,
    "num_layers": TINY_LAYERS,
    "n_layer": TINY_LAYERS,
    "n_layers": TINY_LAYERS,
    "encoder_layers": TINY_LAYERS,
    "decoder_layers": TINY_LAYERS,
    "num_decoder_layers": TINY_LAYERS,
    "num_encoder_layers": TINY_LAYERS,
    "decoder_num_hidden_layers": TINY_LAYERS,
    "num_layers_per_stack": TINY_LAYERS,  # HRM-text: layers per stack, each run H_cycles x (L_cycles + 1) times
    "num_attention_heads": TINY_HEADS,
    "num_heads": TINY_HEADS,
    "n_head": TINY_HEADS,
    "n_heads": TINY_HEADS,
    "encoder_attention_heads": TINY_HEADS,
    "decoder_attention_heads": TINY_HEADS,
    "decoder_num_attention_heads": TINY_HEADS,
    "decoder_hidden_size": TINY_HIDDEN,
    "decoder_intermediate_size": 2 * TINY_HIDDEN,
    "d_kv": 16,
    "rotary_dim": 8,
    # vocab / positions
    "vocab_size": TINY_VOCAB,
    "max_position_embeddings": 512,
    "n_positions": 512,
    "n_ctx": 512,
    "max_source_positions": 64,
    "max_target_positions": 64,
    # mixture of experts / MLA
    "moe_intermediate_size": TINY_HIDDEN,
    "shared_expert_intermediate_size": TINY_HIDDEN,
    "expert_intermediate_size": TINY_HIDDEN,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "moe_k": 2,
    "moe_num_shared_experts": 1,
    "num_groups": 4,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # linear attention / SSM
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    # Kimi Delta Attention (GLM-5-Next, Kimi Linear, Bailing hybrid): its reference chunked form holds a decay mask
    # of batch x heads x 64 x 64 x head_dim floats: 1.2 GB at the default 64 heads of 128 for a batch of 9
    "linear_num_heads": TINY_HEADS,
    "linear_head_dim": 16,
    "state_size": 16,
    "ssm_state_size": 16,
    "time_step_rank": 8,
    # Mamba-2 layers pad the sequence to whole chunks and plan chunk x chunk intermediates: at the default 256 a tiny
    # Bamba plans 4.5 GiB at ExecuTorch's default bounds (batch 16, 512 tokens), over its 2 GiB budget
    "mamba_chunk_size": 16,
    # vision
    "image_size": TINY_IMAGE,
    "patch_size": TINY_PATCH,
    "mm_tokens_per_image": 16,  # Gemma 3's pooled image tokens: a square of 4 x 4 from the 8 x 8 patches
    "latent_query_num": 64,  # Kosmos-2.5's image tokens (2048); Kosmos-2 has 64
    "out_hidden_size": TINY_HIDDEN,
    "vision_output_dim": TINY_HIDDEN,  # Llama 4's vision tower and projector
    "projector_input_dim": TINY_HIDDEN,
    "projector_output_dim": TINY_HIDDEN,  # a vision tower's output width, the text model's (GLM-4V, Qwen2.5-VL)
    "projection_dim": 32,
    "projection_hidden_size": TINY_HIDDEN,  # Kimi-K2.5's projector norm: the vision tower's width
    "projection_size": 32,
    "vision_embed_dim": 32,
    "text_embed_dim": 32,
    # audio / speech
    "num_mel_bins": 16,
    "conv_dim": 32,
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 2,
    "codevector_dim": 32,
    "proj_codevector_dim": 32,
    "classifier_proj_size": 32,
    "xvector_output_dim": 32,
    "output_hidden_size": TINY_HIDDEN,
    "adapter_attn_dim": 16,
}

# Integer-list size fields: element i becomes ``min(value, rule(i))``.
_LIST_CAPS: dict[str, Callable[[int], int]] = {
    "hidden_sizes": lambda i: 16 * 2**i,
    "embed_dims": lambda i: 16 * 2**i,
    "embed_dim": lambda i: 16 * 2**i,
    "depths": lambda i: 1,
    "num_heads": lambda i: 2**i,
    "num_attention_heads": lambda i: 2**i,
    "conv_dim": lambda i: 32,
    "tdnn_dim": lambda i: 32,
    "intermediate_size": lambda i: 2 * TINY_HIDDEN,
    "attention_window": lambda i: 8,
    "image_size": lambda i: TINY_IMAGE,
}

_LAYER_COUNT_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers")
_NO_TRUNCATE = {
    "conv_dim",
    "conv_kernel",
    "conv_stride",
    "hidden_sizes",
    "depths",
    "out_features",
    "out_indices",
}
# (heads key, width key, head-dim key) triples kept consistent after shrinking.
_HEAD_GROUPS = (
    ("num_attention_heads", "hidden_size", "head_dim"),
    ("encoder_attention_heads", "d_model", None),
    ("decoder_attention_heads", "d_model", None),
    ("num_heads", "d_model", None),
    ("num_heads", "hidden_size", None),
    ("num_heads", "embed_dim", None),
    ("n_head", "n_embd", None),
    ("n_heads", "dim", None),
    ("decoder_num_attention_heads", "decoder_hidden_size", None),
)
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "num_query_groups")


def _is_token_key(key: Any) -> bool:
    return isinstance(key, str) and key.endswith(("_token_id", "_token_ids", "_token_index", "_token", "_patch_id"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shrink_dict(d: dict[str, Any]) -> dict[str, Any]:
    """Shrink one (sub-)config dict in place and recurse into nested sub-configs."""
    original = dict(d)
    old_layers = next((original[k] for k in _LAYER_COUNT_KEYS if _is_int(original.get(k))), None)
    pyramid = isinstance(original.get("hidden_sizes"), list | tuple) and len(original["hidden_sizes"]) == old_layers
    for key, value in list(d.items()):
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            if "model_type" in value or any(k in value for k in _INT_CAPS):
                d[key] = _shrink_dict(value)
        elif _is_int(value) and key in _INT_CAPS and value > 0:
            d[key] = min(value, _INT_CAPS[key])
        elif isinstance(value, (list, tuple)) and value and all(_is_int(v) for v in value):
            if key in _LIST_CAPS:
                rule = _LIST_CAPS[key]
                d[key] = type(value)(min(v, rule(i)) if v > 0 else v for i, v in enumerate(value))
            if (
                old_layers
                and not pyramid
                and old_layers > TINY_LAYERS
                and len(value) == old_layers
                and key not in _NO_TRUNCATE
            ):
                d[key] = d[key][:TINY_LAYERS]
        elif (
            isinstance(value, (list, tuple))
            and old_layers
            and not pyramid
            and old_layers > TINY_LAYERS
            and len(value) == old_layers
            and key not in _NO_TRUNCATE
        ):
            d[key] = value[:TINY_LAYERS]  # per-layer lists, e.g. layer_types
    # secondary widths that mirror the main ones (pooler_hidden_size, encoder_hidden_size, ...)
    for main_key, pattern in (
        ("hidden_size", "hidden"),
        ("d_model", "hidden"),
        ("intermediate_size", "intermediate"),
    ):
        old_main, new_main = original.get(main_key), d.get(main_key)
        if not (_is_int(old_main) and _is_int(new_main)) or old_main == new_main:
            continue
        for key, value in original.items():
            mirrors = pattern in key or (pattern == "hidden" and key.endswith(("_dim", "_size")))
            if key != main_key and key not in _INT_CAPS and mirrors and value == old_main:
                d[key] = new_main
    if "vocab_size" in d and d["vocab_size"] is None and "hidden_size" in d:
        d["vocab_size"] = TINY_VOCAB
    experts = any(_is_int(d.get(k)) for k in ("n_routed_experts", "num_experts", "num_local_experts"))
    if experts and "num_experts_per_tok" in d and d["num_experts_per_tok"] is None:
        d["num_experts_per_tok"] = 2
    if pyramid:  # one layer per stage of hidden_sizes (Muse Spark's audio pyramid): the stages stay, shrunk
        for key in _LAYER_COUNT_KEYS:
            if key in d:
                d[key] = original[key]
    new_layers = next((d[k] for k in _LAYER_COUNT_KEYS if _is_int(d.get(k))), None)
    if old_layers and new_layers and new_layers < old_layers:
        # per-layer dicts keyed by layer index
        for key, value in list(d.items()):
            if key.startswith("per_layer") and isinstance(value, dict):
                d[key] = {k: v for k, v in value.items() if str(k).isdigit() and int(k) < new_layers}
        # backbone stages that no longer exist: fall back to the default (last stage)
        if "depths" not in d and ("out_features" in d or "out_indices" in d):
            for key in ("out_features", "out_indices", "stage_names"):
                d.pop(key, None)
    # keep head counts consistent with widths
    for heads_key, width_key, head_dim_key in _HEAD_GROUPS:
        heads, width = d.get(heads_key), d.get(width_key)
        if not (_is_int(heads) and _is_int(width)) or heads <= 0:
            continue
        if width % heads:
            d[heads_key] = heads = math.gcd(width, heads)
        if (
            head_dim_key
            and head_dim_key in d
            and d[head_dim_key] is None
            and heads_key == "num_attention_heads"
        ):
            d[head_dim_key] = width // heads  # what real checkpoints spell out
        elif head_dim_key and _is_int(d.get(head_dim_key)):
            old_hd, old_heads, old_width = original[head_dim_key], original[heads_key], original[width_key]
            if old_hd == original.get("qk_rope_head_dim") and _is_int(d.get("qk_rope_head_dim")):
                d[head_dim_key] = d["qk_rope_head_dim"]  # MLA models alias head_dim to the rope dim
            else:
                d[head_dim_key] = width // heads if old_hd * old_heads == old_width else min(old_hd, 16)
    heads = d.get("num_attention_heads")
    if _is_int(heads) and heads > 0:
        for kv_key in _KV_KEYS:
            kv = original.get(kv_key)
            if not _is_int(kv) or kv <= 0:
                continue
            if kv == original.get("num_attention_heads"):
                d[kv_key] = heads
            else:
                kv = min(kv, 2)
                d[kv_key] = kv if heads % kv == 0 else 1
    heads = d.get("num_heads")
    if "num_attention_heads" not in d and _is_int(heads) and heads > 0:  # a vision tower's (EXAONE 4.5: 16 and 8)
        for kv_key in _KV_KEYS:
            kv = d.get(kv_key)
            if _is_int(kv) and kv > 0 and heads % kv:  # more key/value heads than heads: only those are changed
                d[kv_key] = min(kv, 2) if heads % min(kv, 2) == 0 else 1
    # multimodal rotary sections must sum to head_dim // 2
    head_dim = d.get("head_dim") if _is_int(d.get("head_dim")) else None
    if head_dim is None and _is_int(d.get("hidden_size")) and _is_int(d.get("num_attention_heads")):
        head_dim = d["hidden_size"] // max(d["num_attention_heads"], 1)
    for rope_key in ("rope_parameters", "rope_scaling"):
        rope = d.get(rope_key)
        if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), (list, tuple)) and head_dim:
            rope = dict(rope)
            sec = list(rope["mrope_section"])
            total, half = sum(sec), head_dim // 2
            new = [max(1, s * half // total) for s in sec]
            new[0] += half - sum(new)
            rope["mrope_section"] = new
            d[rope_key] = rope
    return d


def _remap_token_ids(d: Any, vocab: int, mapping: dict[int, int]) -> None:
    """Move special token ids that fall outside the tiny vocab to its top end, consistently."""
    if not isinstance(d, dict):
        return

    def remap(v: int) -> int:
        if v < vocab:
            return v
        if v not in mapping:
            mapping[v] = vocab - 1 - len(mapping)
        return mapping[v]

    for key, value in d.items():
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            _remap_token_ids(value, vocab, mapping)
        elif _is_token_key(key) and _is_int(value):
            d[key] = remap(value)
        elif _is_token_key(key) and isinstance(value, list) and all(_is_int(v) for v in value):
            d[key] = [remap(v) for v in value]


def tiny_config(model_type: str, task: str | None = None, *, keep_image_size: bool = False,
                with_vision: bool = False) -> Any:
    """Build the tiny config of a model type from its default config class.

    Args:
        model_type: A key of ``transformers.CONFIG_MAPPING``.
        task: The zoo task; ``"sequence-classification"`` also gets a pad token id.
        keep_image_size: keep the default config's ``image_size`` and ``patch_size`` (top level and
            ``vision_config``) where no side exceeds :data:`MAX_CONFIG_IMAGE` pixels (the vision cases).
        with_vision: give a config whose ``vision_config`` is optional and None by default (Gemma 4) its sub-config
            class's default, shrunk like the rest, an ``image_token_id`` left None (MiniCPM-V 4.6) a free id, and a
            vision ``projection_dim`` the text width where the default has them equal (Florence-2) (the multimodal
            cases: their vision tower is what they test).

    Returns:
        A ``PreTrainedConfig`` with size fields shrunk (nested sub-configs included).

    Raises:
        NotInstantiable: If the default config cannot be built or shrunk.
    """
    from transformers import CONFIG_MAPPING

    try:
        config_cls = CONFIG_MAPPING[model_type]
    except KeyError:
        raise NotInstantiable(f"no config class for model type {model_type!r}") from None
    try:
        default = config_cls()
    except Exception as exc:  # noqa: BLE001 - any failure is a reason
        raise NotInstantiable(f"default config fails: {_fmt(exc)}") from exc
    d = copy.deepcopy(default.to_dict())
    vision_class = (getattr(config_cls, "sub_configs", None) or {}).get("vision_config")
    if with_vision and d.get("vision_config", 0) is None and vision_class is not None:
        with contextlib.suppress(Exception):  # a default that fails: the case keeps none (no vision tower)
            d["vision_config"] = vision_class().to_dict()
    for key in ("transformers_version", "_name_or_path", "architectures"):
        d.pop(key, None)
    for key, value in _CHECKPOINT_FIELDS.get(model_type, {}).items():
        if isinstance(value, dict) and isinstance(d.get(key), dict):
            for sub_key, sub_value in value.items():
                if d[key].get(sub_key) is None:
                    d[key][sub_key] = sub_value
        else:
            d.setdefault(key, value)
    d = _shrink_dict(d)
    _fill_unset_sizes(d)
    _fit_sam_neck(d)
    _fit_deepstack_layers(d)
    _fit_code_ranges(d)
    _fit_layout_embeddings(d)
    if keep_image_size:
        _restore_image_size(d, default.to_dict())
    if with_vision:
        _fit_vision_projection(d, default.to_dict())
        _raise_vanishing_init(d)
    _scale_pinpoints(d)
    _add_mrope_section(d)
    _put_temporal_section_last(d)
    _fit_vision_feature_layers(d)
    _fit_patch_to_query(d)
    _remap_token_ids(d, TINY_VOCAB, {})
    if with_vision:
        _give_image_token_id(d)
    _fill_vocabulary_map(d)
    if task == "sequence-classification":
        for sub in (d, d.get("text_config")):
            if isinstance(sub, dict) and sub.get("pad_token_id") is None:
                sub["pad_token_id"] = 0
    repaired: list[str] = []
    while True:
        try:
            return config_cls.from_dict(d)
        except Exception as exc:  # noqa: BLE001
            fix = _repair_tiny_config(d, str(exc)) if len(repaired) < _MAX_REPAIRS else None
            if fix is None or fix in repaired:
                raise NotInstantiable(f"tiny config fails: {_fmt(exc)}") from exc
            repaired.append(fix)


_CHECKPOINT_FIELDS: dict[str, dict[str, Any]] = {
    # get_rope_index reads config.vision_start_token_id, which the thinker config class does not declare: the released
    # checkpoints' thinker_config carries it (Qwen/Qwen2.5-Omni-7B, Qwen/Qwen3-Omni-30B-A3B-Instruct: Qwen's
    # <|vision_start|>, 151652, as their talker config's default), and without it every forward fails
    # (AttributeError: 'Qwen2_5OmniThinkerConfig' object has no attribute 'vision_start_token_id')
    "qwen2_5_omni_thinker": {"vision_start_token_id": 151652},
    "qwen3_omni_moe_thinker": {"vision_start_token_id": 151652},
    # Step3p7's text model builds its sliding-window mask whatever its layer_types say, and the class default
    # sliding_window None makes every forward fail (ValueError: Could not find a `sliding_window` argument in the
    # config); its default layers are all full_attention, so the window's value changes no output: the tiny
    # max_position_embeddings (512)
    "step3p7": {"text_config": {"sliding_window": 512}},
}
"""Fields a model type's released checkpoints carry in their config (or its forward needs) that its config class's
defaults lack or leave None, added to the default (a dict value: to that sub-config) before shrinking: token ids move
into the tiny vocab like the others."""


def _token_ids_in(d: Any) -> set[int]:
    if not isinstance(d, dict):
        return set()
    found: set[int] = set()
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            found |= _token_ids_in(value)
        elif _is_token_key(key) and _is_int(value):
            found.add(value)
        elif _is_token_key(key) and isinstance(value, list):
            found |= {v for v in value if _is_int(v)}
    return found


def _give_image_token_id(d: dict[str, Any]) -> None:
    """Give a config that declares ``image_token_id`` but leaves it None (MiniCPM-V 4.6, whose processor adds the
    token) the highest id of the tiny vocab no other token key uses, in place: without one its forward never places
    an image's features (it checks ``image_token_id is not None``)."""
    for key in _FREE_TOKEN_KEYS:
        if key in d and d[key] is None:
            d[key] = _highest_free_token_id(d, TINY_VOCAB)


def _highest_free_token_id(d: dict[str, Any], vocab: int) -> int:
    """The highest id below ``vocab`` that no token key of the config ``d`` (sub-configs included) uses."""
    used = _token_ids_in(d)
    return next(v for v in range(vocab - 1, -1, -1) if v not in used)


_FREE_TOKEN_KEYS = ("image_token_id", "image_token_index", "video_token_index")
"""Placeholder keys :func:`_give_image_token_id` fills where the default config leaves them None: MiniCPM-V's
``image_token_id``, InstructBLIP's ``image_token_index`` and InstructBLIP-Video's ``video_token_index`` (None by
default: their processors add the tokens; without one the forward's placeholder mask is ``input_ids == None``, a
bool)."""


def _layer_count(d: dict[str, Any]) -> int:
    return next((d[k] for k in _LAYER_COUNT_KEYS if _is_int(d.get(k))), TINY_LAYERS)


def _rope_half(d: dict[str, Any]) -> int:
    heads, width = d.get("num_attention_heads") or 1, d.get("hidden_size") or TINY_HIDDEN
    return (d["head_dim"] if _is_int(d.get("head_dim")) else width // heads) // 2


def _per_layer_type_rope(d: dict[str, Any]) -> dict[str, Any]:
    """CohereCompass: one rope dict per layer type, with an M-RoPE section of the tiny head (8:12:12 of its half)."""
    half = _rope_half(d)
    side = max(1, half * 3 // 8)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [half - 2 * side, side, side]}
    return {layer_type: dict(rope) for layer_type in dict.fromkeys(d.get("layer_types") or ["full_attention"])}


_UNSET_SIZES: dict[str, dict[str, Callable[[dict[str, Any]], Any]]] = {
    # its rotary embedding indexes rope_parameters by layer type (KeyError: 'full_attention' with the default's {})
    "cohere_compass_text": {"rope_parameters": _per_layer_type_rope},
    # its decoder layers index mlp_layer_types (TypeError: 'NoneType' object is not subscriptable): the docstring's
    # ["dense", "sparse", "sparse", ...]
    "deepseek_ocr2_text": {"mlp_layer_types": lambda d: ["dense"] + ["sparse"] * (_layer_count(d) - 1)},
    # every text layer has its router and experts (TypeError: empty(): ... NoneType, from nn.Linear(hidden, None))
    "diffusion_gemma_text": {"num_experts": lambda d: 4, "top_k_experts": lambda d: 2,
                             "moe_intermediate_size": lambda d: TINY_HIDDEN},
}
"""Size fields a (sub-)config's default leaves None (or empty) although its model cannot be built without them,
keyed by the sub-config's ``model_type``: each gets a value for the shrunk config (a function of it) in
:func:`_fill_unset_sizes`."""


def _fill_unset_sizes(d: Any) -> None:
    """Give the fields of :data:`_UNSET_SIZES` that the shrunk config ``d`` (and its sub-configs) leaves None or
    empty their tiny value, in place."""
    if not isinstance(d, dict):
        return
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            _fill_unset_sizes(value)
    for key, make in _UNSET_SIZES.get(d.get("model_type"), {}).items():
        if key in d and not d[key]:
            d[key] = make(d)


def _raise_vanishing_init(d: Any) -> None:
    """Give the (sub-)configs of ``d`` whose ``initializer_range`` is below 1e-6 (SAM's vision encoder: 1e-10, which
    trained weights replace) the usual 0.02, in place: random weights of std 1e-10 leave an image's signal below
    float32's resolution after a few layers (DeepSeek-OCR 2's SAM neck gave features of 1e-37, the same for any
    pixels: text only)."""
    if not isinstance(d, dict):
        return
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            _raise_vanishing_init(value)
    if isinstance(d.get("initializer_range"), float) and 0 < d["initializer_range"] < 1e-6:
        d["initializer_range"] = 0.02


def _fit_layout_embeddings(d: dict[str, Any]) -> None:
    """LayoutLMv2/v3 add to each token's embedding the concatenated embeddings of its box, 4 coordinates of
    ``coordinate_size`` and 2 sides of ``shape_size``, as wide as ``hidden_size`` (768 = 4 * 128 + 2 * 128; shrunk to
    64 beside 768: the case failed eagerly): they become 4 * 10 + 2 * 12 = 64 (the tiny width over 6, the rest to
    the sides), in place. LayoutLMv3's page image, ``input_size`` pixels a side (224), becomes :data:`TINY_IMAGE`
    (its patch position embeddings are sized by it: 785 vs 65 for the zoo's 64-pixel image)."""
    coords, shapes, width = d.get("coordinate_size"), d.get("shape_size"), d.get("hidden_size")
    if not all(_is_int(v) and v > 0 for v in (coords, shapes, width)) or 4 * coords + 2 * shapes == width:
        return
    d["coordinate_size"] = width // 6
    d["shape_size"] = (width - 4 * d["coordinate_size"]) // 2
    if d.get("visual_embed") and _is_int(d.get("input_size")):
        d["input_size"] = min(d["input_size"], TINY_IMAGE)


_CODEBOOK = 64
"""Codes a tiny tokenizer's codebook holds (:func:`_fit_code_ranges`, :func:`_fill_vocabulary_map`)."""


def _fill_vocabulary_map(d: dict[str, Any]) -> None:
    """Chameleon maps its VQ-GAN's codes to BPE ids through ``vocabulary_map`` (token name to id: ``"<image>"`` and
    one ``"IMGIMG<code in letters A-J>Z"`` a code), None by default (its tokenizer's vocabulary: the model failed
    construction, ``'NoneType' object has no attribute 'get'``). Where it is None beside a ``vq_config``, the
    codebook keeps :data:`_CODEBOOK` codes, named at ids from the middle of the tiny vocabulary (256 to 319), and
    ``"<image>"`` is the config's ``image_token_id`` (a free id when it has none), in place."""
    vq, text_vocab = d.get("vq_config"), d.get("vocab_size")
    if "vocabulary_map" not in d or d["vocabulary_map"] is not None or not isinstance(vq, dict) or not _is_int(
            text_vocab):
        return
    vq["num_embeddings"] = min(vq.get("num_embeddings") or _CODEBOOK, _CODEBOOK)
    image = d.get("image_token_id")
    if not _is_int(image):
        image = _highest_free_token_id(d, text_vocab)
    letters = str.maketrans("0123456789", "ABCDEFGHIJ")
    codes = {f"IMGIMG{str(i).translate(letters)}Z": text_vocab // 2 + i for i in range(vq["num_embeddings"])}
    d["vocabulary_map"] = {"<image>": image, **codes}


def _fit_code_ranges(d: dict[str, Any]) -> None:
    """Apertus 1.5 embeds its image and audio tokenizers' codes as vocabulary ids: the image codebook from
    ``image_token_offset`` (131272), the audio one right after it (``audio_token_offset``, 262344) and both inside the
    vocabulary (266752; shrunk to 512, the audio range ended at 266440: the tiny config failed validation). The
    codebooks keep :data:`_CODEBOOK` codes each, from the middle of the tiny vocabulary (256 and 320; the
    placeholder tokens, moved to its top end, stay outside both), in place."""
    vision, audio, text = (d.get(k) for k in ("vision_config", "audio_config", "text_config"))
    if not (all(isinstance(x, dict) for x in (vision, audio, text)) and _is_int(d.get("image_token_offset"))
            and _is_int(d.get("audio_token_offset")) and _is_int(vision.get("codebook_size"))
            and _is_int(audio.get("codebook_size")) and _is_int(text.get("vocab_size"))):
        return
    vocab = text["vocab_size"]
    if d["audio_token_offset"] + audio["codebook_size"] <= vocab:
        return
    vision["codebook_size"] = audio["codebook_size"] = _CODEBOOK
    d["image_token_offset"] = vocab // 2
    d["audio_token_offset"] = vocab // 2 + _CODEBOOK


def _fit_deepstack_layers(d: dict[str, Any]) -> None:
    """Granite 4 Vision injects window-Q-Former projections of vision layers into language-model layers: one a
    ``deepstack_layer_map`` pair ``(vision layer, LLM layer)`` (None by default: construction failed, ``object of
    type 'NoneType' has no len()``) and four spatial offset groups at ``spatial_target_layers`` (``[12, 15, 18,
    21]``, beyond the tiny model's layers), downsampled by ``downsample_rate`` (None by default: ``"q/w"``, query and
    window sides). The tiny config maps the vision tower's middle layer to LLM layer 0 and the spatial groups to
    layers 1-4 (one layer each, as the real ones: a layer takes one injection), with 5 text layers, and a
    ``"2/4"`` rate (2 x 2 queries a 4 x 4 window, the spatial groups' 2 x 2 sampling), in place."""
    vision, text = d.get("vision_config"), d.get("text_config")
    if not ("deepstack_layer_map" in d and d["deepstack_layer_map"] is None and isinstance(vision, dict)
            and isinstance(text, dict) and isinstance(d.get("spatial_target_layers"), list)):
        return
    groups = len(d["spatial_target_layers"])
    d["deepstack_layer_map"] = [[max(_layer_count(vision) // 2, 1), 0]]
    d["spatial_target_layers"] = list(range(1, groups + 1))
    text["num_hidden_layers"] = groups + 1
    if d.get("downsample_rate") is None:
        d["downsample_rate"] = "2/4"


def _fit_sam_neck(d: dict[str, Any]) -> None:
    """DeepSeek-OCR 2's SAM neck ends in ``sam_config.downsample_channels[-1]`` channels (896), the width of the
    encoder its patches go on to (``encoder_config.hidden_size``, 896, shrunk to 64: torch.cat of the patches and the
    queries failed, 896 vs 64): the neck's widths become half and all of the shrunk encoder's, in place."""
    vision = d.get("vision_config")
    sam, encoder = (vision.get(k) if isinstance(vision, dict) else None for k in ("sam_config", "encoder_config"))
    if not (isinstance(sam, dict) and isinstance(encoder, dict) and _is_int(encoder.get("hidden_size"))):
        return
    channels, width = sam.get("downsample_channels"), encoder["hidden_size"]
    if isinstance(channels, list) and len(channels) == 2 and channels[-1] != width:
        sam["downsample_channels"] = [max(width // 2, 1), width]


def _fit_vision_projection(d: dict[str, Any], original: dict[str, Any]) -> None:
    """Keep a vision tower's ``projection_dim`` equal to the text model's width where the default config has them
    equal (Florence-2: the image features are text-embedding rows), and a top-level ``out_hidden_size`` equal to the
    vision width times the merge size squared where it was (MuseGlimmer's adapter input), in place;
    :data:`_INT_CAPS` shrinks them to other sizes."""
    vlm, vlm0 = d.get("vlm_config"), original.get("vlm_config")
    if isinstance(vlm, dict) and isinstance(vlm0, dict):  # PI0's PaliGemma: its projection_dim is the vision one's
        text, text0 = vlm.get("text_config"), vlm0.get("text_config")
        if (isinstance(text, dict) and isinstance(text0, dict) and _is_int(vlm.get("projection_dim"))
                and vlm0.get("projection_dim") == text0.get("hidden_size")):
            vlm["projection_dim"] = text["hidden_size"]
        _fit_vision_projection(vlm, vlm0)
    vision, text = d.get("vision_config"), d.get("text_config")
    vision0, text0 = original.get("vision_config"), original.get("text_config")
    if not all(isinstance(x, dict) for x in (vision, text, vision0, text0)):
        return
    width_key = next((k for k in ("hidden_size", "d_model") if _is_int(text.get(k))), None)
    if width_key and _is_int(vision.get("projection_dim")) and vision0.get("projection_dim") == text0.get(width_key):
        vision["projection_dim"] = text[width_key]
    # MuseGlimmer: the adapter takes the merged vision features, hidden_size * merge_size ** 2 wide
    merge0, merge = (next((v for k in ("spatial_merge_size", "merge_size") if _is_int(v := x.get(k))), None)
                     for x in (vision0, vision))
    if (merge0 and merge and _is_int(d.get("out_hidden_size")) and _is_int(vision.get("hidden_size"))
            and original.get("out_hidden_size") == vision0.get("hidden_size") * merge0 ** 2):
        d["out_hidden_size"] = vision["hidden_size"] * merge ** 2


def _restore_image_size(d: dict[str, Any], original: dict[str, Any]) -> None:
    """Put the default config's ``image_size`` and ``patch_size`` back into the shrunk ``d`` (and its
    ``vision_config``) where no side of the image exceeds :data:`MAX_CONFIG_IMAGE`."""
    for shrunk, default in ((d, original), (d.get("vision_config"), original.get("vision_config"))):
        if not isinstance(shrunk, dict) or not isinstance(default, dict):
            continue
        size = default.get("image_size")
        sides = [size] if _is_int(size) else list(size) if isinstance(size, (list, tuple)) else []
        if sides and all(_is_int(v) and 0 < v <= MAX_CONFIG_IMAGE for v in sides):
            shrunk["image_size"] = size
            if "patch_size" in default:
                shrunk["patch_size"] = default["patch_size"]


def _scale_pinpoints(d: dict[str, Any]) -> None:
    """Scale LLaVA-NeXT's ``image_grid_pinpoints`` (resolutions in whole tiles of the vision tower's image size:
    336-pixel tiles by default) to tiles of the shrunk vision config's ``image_size``, in place, so that the anyres
    crops of an image stay whole tiles."""
    pinpoints, vision = d.get("image_grid_pinpoints"), d.get("vision_config")
    side = _side(vision.get("image_size")) if isinstance(vision, dict) else None
    if not (isinstance(pinpoints, list) and pinpoints and side
            and all(isinstance(p, list | tuple) and p and all(_is_int(v) and v > 0 for v in p) for p in pinpoints)):
        return
    tile = math.gcd(*(v for p in pinpoints for v in p))
    if tile != side:
        d["image_grid_pinpoints"] = [[v // tile * side for v in p] for p in pinpoints]


def _fit_vision_feature_layers(d: dict[str, Any]) -> None:
    """Clamp ``vision_feature_layer`` (VipLLaVA's list ``[-2, -5, -8, -11, 6]``) to the hidden states of the shrunk
    vision tower (:data:`TINY_LAYERS` + 1), in place; the list keeps its length (its projector's width)."""
    layers = d.get("vision_feature_layer")
    low, high = -(TINY_LAYERS + 1), TINY_LAYERS
    if isinstance(layers, list) and layers and all(_is_int(v) for v in layers):
        d["vision_feature_layer"] = [min(max(v, low), high) for v in layers]
    _fit_adapter_feature_layers(d)
    _fit_high_res_global_layers(d)
    _fit_pooling_adapter(d)


def _fit_pooling_adapter(d: dict[str, Any]) -> None:
    """Molmo2's vision tower adds one position embedding per patch (``num_position_embeddings``, 729 for its 27 x 27
    patches: the tiny 64-pixel image in 8-pixel patches has 64) and its pooling adapter projects to
    ``adapter_config.text_hidden_size`` (3584, the text width, shrunk to 64): both follow the shrunk config, in
    place."""
    adapter, vision, text = (d.get(k) for k in ("adapter_config", "vision_config", "text_config"))
    if not (isinstance(adapter, dict) and isinstance(vision, dict) and isinstance(text, dict)):
        return
    if _is_int(adapter.get("text_hidden_size")) and _is_int(text.get("hidden_size")):
        adapter["text_hidden_size"] = text["hidden_size"]
    side, patch = _side(vision.get("image_size")), _side(vision.get("patch_size"))
    if _is_int(vision.get("num_position_embeddings")) and side and patch:
        vision["num_position_embeddings"] = (side // patch) ** 2


def _fit_high_res_global_layers(d: dict[str, Any]) -> None:
    """DeepSeek-VL hybrid reads its high-res (SAM) tower's hidden state after its first global-attention layer,
    ``high_res_vision_config.global_attn_indexes[0]`` (``[2, 5, 8, 11]`` of 12 layers; IndexError in
    get_high_res_image_features with 2): the indexes past the shrunk tower become its last layer (``[1]``: a windowed
    layer, then a global one), in place."""
    high = d.get("high_res_vision_config")
    indexes = high.get("global_attn_indexes") if isinstance(high, dict) else None
    depth = high.get("num_hidden_layers") if isinstance(high, dict) else None
    if isinstance(indexes, list) and indexes and all(_is_int(v) for v in indexes) and _is_int(depth) and depth > 0:
        high["global_attn_indexes"] = sorted({min(v, depth - 1) for v in indexes})


def _fit_adapter_feature_layers(d: dict[str, Any]) -> None:
    """Molmo2's ``adapter_config.vision_feature_layer`` (``[24, 18]``) indexes the vision tower's layers (its
    validator wants ``-layers <= i < layers``): give the shrunk tower's last layers in the same order (``[1, 0]``),
    in place; the list keeps its length (its pooling width)."""
    adapter, vision = d.get("adapter_config"), d.get("vision_config")
    layers = adapter.get("vision_feature_layer") if isinstance(adapter, dict) else None
    depth = vision.get("num_hidden_layers") if isinstance(vision, dict) else None
    if not (isinstance(layers, list) and layers and all(_is_int(v) for v in layers) and _is_int(depth) and depth > 0):
        return
    if all(-depth <= v < depth for v in layers):
        return
    rank = sorted(set(layers), reverse=True)  # the deepest first: the tower's last layer
    adapter["vision_feature_layer"] = [max(depth - 1 - rank.index(v), 0) for v in layers]


def _fit_patch_to_query(d: dict[str, Any]) -> None:
    """Aria's ``projector_patch_to_query_dict`` maps the patch count of an image (1225 for 490 pixels in 14-pixel
    patches) to its query count: give the shrunk vision tower's patch count 16 queries, in place."""
    table, vision = d.get("projector_patch_to_query_dict"), d.get("vision_config")
    side = _side(vision.get("image_size")) if isinstance(vision, dict) else None
    patch = _side(vision.get("patch_size")) if isinstance(vision, dict) else None
    if isinstance(table, dict) and table and side and patch:
        d["projector_patch_to_query_dict"] = {(side // patch) ** 2: 16}


def _add_mrope_section(d: dict[str, Any]) -> None:
    """Give the text config of a model with a merging vision tower (``vision_config.spatial_merge_size``: Qwen-VL,
    GLM-4V and their kin) an ``mrope_section`` that sums to the tiny head's rotary half, in place, where its rope
    parameters name none or one of another sum: such a model falls back to the section of its real head (``[8, 12,
    12]``, 32 of a 128-wide head), which the shrunk head cannot split."""
    vision, text = d.get("vision_config"), d.get("text_config")
    if not (isinstance(vision, dict) and "spatial_merge_size" in vision and isinstance(text, dict)):
        return
    rope = text.get("rope_parameters")
    heads, width = text.get("num_attention_heads"), text.get("hidden_size")
    if not isinstance(rope, dict) or "rope_type" not in rope or not (_is_int(heads) and _is_int(width) and heads):
        return  # none, or one per layer type
    head_dim = text.get("head_dim") if _is_int(text.get("head_dim")) else width // heads
    factor = rope.get("partial_rotary_factor") or text.get("partial_rotary_factor") or 1.0
    half = int(head_dim * factor) // 2
    section = rope.get("mrope_section")
    if isinstance(section, list | tuple) and sum(section) == half:
        return
    side = max(1, half * 3 // 8)  # the 8:12:12 split of the real models
    if half > 2 * side:
        text["rope_parameters"] = {**rope, "mrope_section": [half - 2 * side, side, side]}


_TEMPORAL_SECTION_LAST = ("ernie4_5_vl_moe_text",)
"""Text model types whose ``mrope_section`` lists the height, width and then the temporal rotary section (ERNIE 4.5
VL: ``[22, 22, 20]``, height and width interleaved, so as many of each), where Qwen-VL lists the temporal first."""


def _put_temporal_section_last(d: dict[str, Any]) -> None:
    """The ``mrope_section`` that :func:`_add_mrope_section` gives in Qwen-VL's order (temporal, height, width:
    ``[2, 3, 3]``) in the order of a :data:`_TEMPORAL_SECTION_LAST` model (``[3, 3, 2]``), in place: ERNIE 4.5 VL
    stacks its height and width sections (``stack expects each tensor to be equal size``, 2 vs 3: every forward
    failed)."""
    text = d.get("text_config")
    rope = text.get("rope_parameters") if isinstance(text, dict) else None
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    if (isinstance(section, list) and text.get("model_type") in _TEMPORAL_SECTION_LAST and len(section) == 3
            and section[0] != section[1] and section[1] == section[2]):
        text["rope_parameters"] = {**rope, "mrope_section": [section[1], section[2], section[0]]}


_MAX_REPAIRS = 6
# A config validator that names the field and the value it wants: "`d_head` (64) should be equal to `d_model //
# n_head` (16)", "`vision_config.text_hidden_size` (4608) must match `text_config.hidden_size` (64)",
# "vision_config.out_hidden_size (1024) must equal text_config.hidden_size (64)".
_WANTS_VALUE = re.compile(r"(?:^|: )`?(?P<field>[A-Za-z_][\w.]*)`? \((?P<have>-?\d+)\) (?:should be equal to|must equal|must match) "
                          r"`?[^()]+?`? \((?P<want>-?\d+)\)")
_MUST_BE = re.compile(r"(?:^|: )`?(?P<field>[A-Za-z_][\w.]*)`? must be (?P<want>-?\d+), got (?P<have>-?\d+)")


def _repair_tiny_config(d: dict[str, Any], message: str) -> str | None:
    """Make the shrunk config ``d`` satisfy the architecture check that ``message`` reports, in place.

    Shrinking every size field to the same tiny value breaks the relations some configs validate (a head size that
    must be ``d_model // n_head``, an adapter width that must match the text model's). The validators that name the
    field and the value they want are answered with that value; the Mamba-2 head split (``heads * head_dim ==
    expand * hidden``) is recomputed. Returns what was changed (``"field=value"``), or None when the message is
    not one of these.
    """
    match = _WANTS_VALUE.search(message) or _MUST_BE.search(message)
    if match is not None:
        *parents, key = match["field"].split(".")
        target: Any = d
        for parent in parents:
            target = target.get(parent) if isinstance(target, dict) else None
        if isinstance(target, dict) and (key not in target or _is_int(target[key])):
            target[key] = int(match["want"])
            return f"{match['field']}={match['want']}"
        return None
    for heads, head_dim, expand in (("mamba_n_heads", "mamba_d_head", "mamba_expand"),
                                    ("num_heads", "head_dim", "expand")):
        if "head" in message.lower() and all(_is_int(d.get(k)) for k in (heads, head_dim, expand, "hidden_size")):
            inner = d[expand] * d["hidden_size"]
            if inner % d[heads] == 0 and d[heads] * d[head_dim] != inner:
                d[head_dim] = inner // d[heads]
                return f"{head_dim}={d[head_dim]}"
    return None


# --------------------------------------------------------------------------- inputs


def _fmt(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    if len(msg) > 200:
        msg = msg[:197] + "..."
    return f"{type(exc).__name__}: {msg}"


@functools.lru_cache(maxsize=1)
def _large_batch_cases() -> frozenset[str]:
    return frozenset(c.case_id for c in sample_cases(0))


def case_shapes(case: ZooCase, model: torch.nn.Module | None = None) -> dict[str, tuple[int, int]]:
    """The traced and the alt size of each dim the zoo chooses for ``case``: ``{"batch": (2, 3)}`` (``(9, 10)``
    for the one case per model type that ``sample_cases(0)`` draws: a batch above 8), ``"seq"`` (text tokens,
    8 and 12), ``"decoder_seq"`` (6 and 5) and, for an audio or speech ``model``, ``"audio"`` (``input_values``
    samples: 1 s and 1.25 s at ``config.sampling_rate``, else 16 kHz) or ``"frames"`` (``input_features``: 100
    and 128, 10 ms each; Whisper keeps its 2 x ``max_source_positions``).
    """
    large = case.case_id in _large_batch_cases()
    shapes = {"batch": (LARGE_BATCH, ALT_LARGE_BATCH) if large else (BATCH, ALT_BATCH),
              "seq": (SEQ_LEN, ALT_SEQ_LEN), "decoder_seq": (DECODER_SEQ_LEN, ALT_DECODER_SEQ_LEN)}
    if model is not None and case.modality in ("audio", "speech"):
        from hfexport_dynamo import forward_parameters

        names = forward_parameters(model)[0]
        order = ("input_features", "input_values") if case.modality == "speech" else ("input_values", "input_features")
        name = next((n for n in order if n in names), None)
        if name == "input_values":
            rate = getattr(model.config, "sampling_rate", None) or 16000
            shapes["audio"] = (math.ceil(AUDIO_SECONDS * rate), math.ceil(ALT_AUDIO_SECONDS * rate))
        elif name == "input_features":
            # dummy_inputs makes frames in multiples of 4
            shapes["frames"] = (4 * math.ceil(25 * AUDIO_SECONDS), 4 * math.ceil(25 * ALT_AUDIO_SECONDS))
    return shapes


def _make_inputs(case: ZooCase, model: torch.nn.Module, gen: torch.Generator) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(inputs, alt_inputs)`` from hfexport-dynamo's dummy-input builder, both drawn from ``gen``, at the sizes
    of :func:`case_shapes`.

    The zoo's choices: the modality of the case, no padding, a decoder sequence shorter at the alt shape than at
    the traced one, token types wherever forward takes them, ids below the tiny vocab, a vision case's images at
    its config's size (224x224 where it names none), and ``use_cache=False`` (a decoder returns no cache to
    compare). A multimodal case gets text here; :func:`_add_image_inputs` then adds images where its recipe works.
    """
    from hfexport_dynamo import dummy_inputs, forward_parameters

    takes_use_cache = "use_cache" in forward_parameters(model)[0]
    shapes = case_shapes(case, model)
    # dummy_inputs makes 200 * seq audio samples and 4 * seq feature frames
    seqs = shapes["seq"]
    if "audio" in shapes:
        seqs = tuple(math.ceil(n / 200) for n in shapes["audio"])
    elif "frames" in shapes:
        seqs = tuple(math.ceil(n / 4) for n in shapes["frames"])
    image = 224 if case.modality == "vision" else TINY_IMAGE
    both = []
    for i in (0, 1):
        batch, seq, decoder_seq = shapes["batch"][i], seqs[i], shapes["decoder_seq"][i]
        try:
            inputs = dummy_inputs(model, batch, seq, generator=gen, modality=case.modality, padding=False,
                                  decoder_seq=decoder_seq, token_type_ids=True, max_vocab=TINY_VOCAB,
                                  default_image_size=image)
        except ValueError as exc:  # forward takes none of the inputs of the case's modality
            raise NotInstantiable(str(exc)) from exc
        if "audio" in shapes and "input_values" in inputs:
            inputs["input_values"] = inputs["input_values"][:, :shapes["audio"][i]]
        if takes_use_cache:
            inputs["use_cache"] = False
        both.append(inputs)
    return both[0], both[1]


# --------------------------------------------------------------------------- images and audio of multimodal cases

IMAGE_INPUTS_ATTR = "_hfexport_zoo_image_inputs"
"""Attribute of a built multimodal case's model holding its :class:`ImageInputs` (see :func:`image_inputs`)."""

_IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index")
_AUDIO_TOKEN_KEYS = ("audio_token_id", "audio_token_index")
_AUDIO_MASKS = ("feature_attention_mask", "input_features_mask", "audio_attention_mask", "feature_mask")
"""Names a multimodal forward gives the mask of ``input_features`` (``[clips, frames]``, ones where real)."""
MEDIA_KINDS = ("pixel_values", "per_row", "image_grid_thw", "image_sizes", "pixel_attention_mask", "spatial_shapes",
               "target_sizes", "image_position_ids", "qformer_input_ids", "audio", "cameras", "image_token_pooling")
"""What a multimodal case's media inputs are (:attr:`ImageInputs.kind`): ``pixel_values [1, C, H, W]`` alone (one
image, placeholder tokens: LLaVA, PaliGemma, ...), ``per_row`` (``[batch, C, H, W]``, no placeholders: GIT, ViLT),
``image_grid_thw`` (flattened patches ``[patches, C * temporal_patch * patch * patch]`` and their grid ``[[1, h,
w]]``: the Qwen-VL and GLM-V families; Inkling2: one ``[merge * patch, merge * patch, C]`` block per image token and
the grid in tokens), ``image_sizes`` (``[[H, W]]`` beside ``[1, C, H, W]``, or the anyres ``[1, crops, C, H, W]``:
Pixtral, LLaVA-NeXT), ``pixel_attention_mask`` (``[1, 1, C, H, W]`` and a mask ``[1, 1, H, W]``: Idefics2/3,
SmolVLM), ``spatial_shapes`` (NaFlex patches ``[1, h * w, C * patch * patch]``, ``[[h, w]]`` and a mask ``[1, h *
w]``: LFM2-VL), ``target_sizes`` (``[1, C, H, W]`` and its patch grid ``[[h, w]]``: MiniCPM-V),
``image_position_ids`` (patches ``[1, n, 3 * patch * patch]`` and their ``(x, y)`` ``[1, n, 2]``, a grid of whole
pooling kernels: Gemma 4), ``qformer_input_ids`` (``[1, C, H, W]``, or 4 frames ``[1, 4, C, H, W]``, and the
Q-Former's prompt ``[1, 8]``, ``num_query_tokens`` placeholders a frame: InstructBLIP, InstructBLIP-Video), ``audio`` (``input_features [1, mel bins, frames]`` and its mask: Qwen2-Audio,
GLM-ASR, ...), ``cameras`` (one camera image a row, ``[batch, 1, C, H, W]`` with ``pixel_attention_mask [batch,
1]``, its placeholders at the start of every row, beside the ``action_embeds`` a vision-language-action model's
forward requires: PI0) and ``image_token_pooling`` (one crop's patches ``[1, patches, C * patch * patch]``, the patches
each image token pools, a 2 x 2 window ``[tokens, 4]``, the pooled grid ``[[h, w, 0, 0]]`` and one crop: Molmo2)."""


@dataclass(frozen=True)
class ImageInputs:
    """Whether a multimodal zoo case got images (or audio), of which kind, and why not when it did not.

    Attributes:
        used: ``inputs`` and ``alt_inputs`` hold the media inputs of :attr:`kind` and the eager forward reads
            them (its first output changes with the pixels or features).
        tokens_per_image: image (or audio) placeholder tokens in ``input_ids``: as many as the model's
            ``get_image_features`` (``get_audio_features``) yields for the one image (clip), at the start of the
            first row; 0 for a model that takes no placeholders (one image per row), or when unused.
        reason: why the case kept text-only inputs (one line), None when ``used``.
        kind: one of :data:`MEDIA_KINDS` when ``used``, else ``""``.
    """

    used: bool
    tokens_per_image: int = 0
    reason: str | None = None
    kind: str = ""

    def describe(self) -> str:
        """One line for a sweep record: ``"one image, 64 placeholder tokens (image_grid_thw)"``, ``"one image per
        row"``, ``"one audio clip, 16 placeholder tokens (audio)"`` or ``"text only: <reason>"``."""
        if not self.used:
            return f"text only: {self.reason}"
        if self.kind == "per_row":
            return "one image per row"
        if self.kind == "cameras":
            return f"one camera image per row, {self.tokens_per_image} placeholder tokens each (cameras)"
        what = "one audio clip" if self.kind == "audio" else "one image"
        return f"{what}, {self.tokens_per_image} placeholder tokens ({self.kind})"


def image_inputs(model: torch.nn.Module) -> ImageInputs | None:
    """What :func:`build_case` did about images (or audio) for this model: an :class:`ImageInputs` for a
    multimodal case, None for other cases (and models not built by the zoo)."""
    return getattr(model, IMAGE_INPUTS_ATTR, None)


def _token_id(config: Any, keys: tuple[str, ...]) -> int | None:
    for sub in (config, getattr(config, "text_config", None), getattr(config, "thinker_config", None)):
        for key in keys:
            value = getattr(sub, key, None) if sub is not None else None
            if _is_int(value) and value >= 0:
                return value
    return None


def _image_token_id(config: Any) -> int | None:
    return _token_id(config, _IMAGE_TOKEN_KEYS)


def _params(fn: Any) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _feature_owner(model: torch.nn.Module, method: str) -> Any:
    return next((m for m in (model, getattr(model, "model", None)) if m is not None and hasattr(m, method)), None)


def _feature_count(model: torch.nn.Module, media: Mapping[str, Any], method: str = "get_image_features") -> int:
    """Features (text-embedding rows) the model's ``get_image_features`` (or ``get_audio_features``) yields for
    the media inputs of one image (clip), ``media``: the arguments it takes among them are passed.

    Raises:
        ValueError: the model has no such method, or its result is not a whole number of text-embedding rows.
    """
    owner = _feature_owner(model, method)
    if owner is None:
        raise ValueError(f"{type(model).__name__} has no {method}")
    # a head's method may pass some of its base model's arguments on through **kwargs (MOSS-Transcribe-Diarize's
    # padding_mask): the arguments either names are passed
    takes = _params(getattr(owner, method))
    if "kwargs" in takes:
        takes |= _params(getattr(getattr(owner, "model", None), method, None))
    with torch.no_grad():
        features = getattr(owner, method)(**{k: v for k, v in media.items() if k in takes})
    deepstack = getattr(features, "deepstack_features", None)
    if isinstance(deepstack, list) and deepstack and getattr(features, "pooler_output", None) is None:
        features = deepstack[0][1]  # Granite 4 Vision: (LLM layer, per-image features) pairs, each as many rows
    if isinstance(features, Mapping) or hasattr(features, "pooler_output"):
        pooled = getattr(features, "pooler_output", None)  # transformers 5: the projected features
        # Fuyu's are its embedded patches, the last hidden state (it pools nothing)
        features = pooled if pooled is not None else getattr(features, "last_hidden_state", None)
    tensors = [features] if isinstance(features, torch.Tensor) else list(features or [])
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ValueError(f"{method} gives no tensors ({type(features).__name__})")
    width = model.get_input_embeddings().weight.shape[-1]
    total = sum(t.numel() for t in tensors)
    if total == 0 or total % width:
        raise ValueError(f"{method} gives {total} values, not rows of the text width {width}")
    return total // width


def _image_feature_count(model: torch.nn.Module, pixel_values: torch.Tensor) -> int:
    """:func:`_feature_count` of one image ``pixel_values [1, C, H, W]``."""
    return _feature_count(model, {"pixel_values": pixel_values})


def _with_media_tokens(inputs: dict[str, Any], media: Mapping[str, Any], token: int,
                       filler_ids: torch.Tensor) -> dict[str, Any]:
    """``inputs`` with one image (or audio clip), ``media``, in the first row: its ``k`` placeholder tokens
    prefixed to that row's text, and ``filler_ids`` (``[batch - 1, k]`` text ids) to the other rows'; the other
    token inputs get ``k`` ones (``attention_mask``) or zeros (token types) in front."""
    out = {**inputs, **media}
    from hfexport_dynamo.inputs import TOKEN_INPUTS

    tokens = filler_ids.shape[1]
    for name in TOKEN_INPUTS:
        value = out.get(name)
        if not (isinstance(value, torch.Tensor) and value.dim() == 2):
            continue
        if name == "input_ids":
            prefix = torch.cat([torch.full((1, tokens), token, dtype=value.dtype), filler_ids.to(value.dtype)])
        else:
            prefix = torch.full((value.shape[0], tokens), 1 if name == "attention_mask" else 0, dtype=value.dtype)
        out[name] = torch.cat([prefix, value], dim=1)
    return out


def _with_image_tokens(inputs: dict[str, Any], pixel_values: torch.Tensor, image_token: int,
                       filler_ids: torch.Tensor) -> dict[str, Any]:
    """:func:`_with_media_tokens` of one image ``pixel_values [1, C, H, W]``."""
    return _with_media_tokens(inputs, {"pixel_values": pixel_values}, image_token, filler_ids)


def _first_float_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, list | tuple) else ()
    return next((t for v in values if (t := _first_float_tensor(v)) is not None), None)


def _side(value: Any) -> int | None:
    """An image side or patch size of a config (an int, or the first of a pair)."""
    if isinstance(value, list | tuple) and value:
        value = value[0]
    return value if _is_int(value) and value > 0 else None


def _vision_facts(config: Any) -> dict[str, int]:
    """``channels``, ``image`` (side, pixels: the config's size, else :data:`TINY_IMAGE`), ``patch``,
    ``temporal`` (temporal patch size, 1 where none), ``merge`` (spatial merge size, 1 where none) of the vision
    config."""
    vision = getattr(config, "vision_config", None) or getattr(getattr(config, "thinker_config", None),
                                                              "vision_config", None) or config
    patch = _side(getattr(vision, "patch_size", None)) or TINY_PATCH
    image = _side(getattr(vision, "image_size", None))
    image = image if image is not None and image <= MAX_CONFIG_IMAGE else TINY_IMAGE
    merge = next((v for k in ("spatial_merge_size", "merge_size") if _is_int(v := getattr(vision, k, None))), 1)
    channels = next((v for k in ("in_channels", "num_channels", "in_chans")
                     if _is_int(v := getattr(vision, k, None)) and v > 0), 3)
    return {"channels": channels, "image": image, "patch": patch, "merge": max(merge, 1),
            "temporal": _side(getattr(vision, "temporal_patch_size", None)) or 1}


def _anyres_crops(model: torch.nn.Module, side: int) -> int | None:
    """Crops (the base image included) LLaVA-NeXT's anyres processing makes of a ``side x side`` image: the
    model's own ``image_size_to_num_patches`` over ``config.image_grid_pinpoints``; None without pinpoints."""
    import sys

    pinpoints = getattr(model.config, "image_grid_pinpoints", None)
    if not pinpoints:
        return None
    helper = getattr(sys.modules.get(type(model).__module__), "image_size_to_num_patches", None)
    if helper is None:
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches as helper
    return int(helper(image_size=(side, side), grid_pinpoints=pinpoints, patch_size=side))


def _image_recipes(model: torch.nn.Module, draw: Callable[..., torch.Tensor]) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """``(kind, make)`` pairs, the first to try first: ``make()`` gives the media inputs of one image as the
    model's processor lays them out (:data:`MEDIA_KINDS`), at the config's image size, its pixels from ``draw(*shape)``.
    Which kinds are tried follows the arguments of the model's ``get_image_features`` and ``forward``."""
    from hfexport_dynamo import forward_parameters

    dry = [False]  # while the recipes are filtered by the names they give: draw nothing

    def pixels(*shape: int) -> torch.Tensor:
        return torch.empty(shape) if dry[0] else draw(*shape)

    facts = _vision_facts(model.config)
    c, side, p, t, m = facts["channels"], facts["image"], facts["patch"], facts["temporal"], facts["merge"]
    names = set(forward_parameters(model)[0])
    owner = _feature_owner(model, "get_image_features")
    takes = (_params(owner.get_image_features) if owner is not None else set()) | names
    recipes: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if "image_grid_thw" in takes:
        grid = max(m, side // p // m * m)  # patches a side: whole merge windows
        thw = torch.tensor([[1, grid, grid]])
        extra = {"image_merge_sizes": torch.tensor([m])} if "image_merge_sizes" in takes else {}
        recipes += [("image_grid_thw", lambda tp=tp: {"pixel_values": pixels(grid * grid, c * tp * p * p),
                                                      "image_grid_thw": thw, **extra})
                    for tp in dict.fromkeys((t, 2))]  # a config without temporal_patch_size may still take 2 frames
        recipes += [("image_grid_thw", lambda: {"pixel_values": pixels(grid * grid, c, p, p),
                                                "image_grid_thw": thw, **extra}),
                    ("image_grid_thw", lambda: {"pixel_values": pixels(1, c, grid * p, grid * p),
                                                "image_grid_thw": thw, **extra})]
        if m > 1:  # Inkling2: one pixel block of m x m patches, channels last, per language-model token, and the grid
            tokens = grid // m  # counted in those tokens
            recipes.append(("image_grid_thw", lambda: {"pixel_values": pixels(tokens * tokens, m * p, m * p, c),
                                                       "image_grid_thw": torch.tensor([[1, tokens, tokens]]), **extra}))
    if "image_sizes" in takes:
        sizes = torch.tensor([[side, side]])
        recipes.append(("image_sizes", lambda: {"pixel_values": pixels(1, c, side, side), "image_sizes": sizes}))
        crops = _anyres_crops(model, side)
        if crops is not None:
            recipes.insert(len(recipes) - 1, ("image_sizes", lambda: {
                "pixel_values": pixels(1, crops, c, side, side), "image_sizes": sizes}))
    if "spatial_shapes" in takes:
        grid = side // p
        recipes.append(("spatial_shapes", lambda: {
            "pixel_values": pixels(1, grid * grid, c * p * p), "spatial_shapes": torch.tensor([[grid, grid]]),
            "pixel_attention_mask": torch.ones(1, grid * grid, dtype=torch.bool)}))
    elif "pixel_attention_mask" in takes:  # per pixel (Idefics2/3), else per tile (Granite Docling)
        recipes += [("pixel_attention_mask", lambda: {"pixel_values": pixels(1, 1, c, side, side),
                                                      "pixel_attention_mask": torch.ones(1, 1, side, side, dtype=torch.bool)}),
                    ("pixel_attention_mask", lambda: {"pixel_values": pixels(1, 1, c, side, side),
                                                      "pixel_attention_mask": torch.ones(1, 1, dtype=torch.bool)})]
    if "image_position_ids" in takes:  # Gemma 4: patches [1, n, 3 * p * p] and their (x, y), pooled k x k
        k = _side(getattr(getattr(model.config, "vision_config", None), "pooling_kernel_size", None)) or 1
        cells = max(k, side // p // k * k)
        ys, xs = torch.meshgrid(torch.arange(cells), torch.arange(cells), indexing="ij")
        where = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)[None]
        recipes.append(("image_position_ids", lambda: {"pixel_values": pixels(1, cells * cells, 3 * p * p),
                                                       "image_position_ids": where}))
        if k > 1:  # Gemma 4 unified: one patch per model patch, k x k patches merged ([1, n, 3 * (k * p) ** 2])
            merged = max(1, side // (k * p))
            ys, xs = torch.meshgrid(torch.arange(merged), torch.arange(merged), indexing="ij")
            merged_where = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)[None]
            recipes.append(("image_position_ids", lambda: {"pixel_values": pixels(1, merged * merged, 3 * (k * p) ** 2),
                                                           "image_position_ids": merged_where}))
    if "qformer_input_ids" in takes:  # InstructBLIP(-Video): the image (or its frames) and the Q-Former's prompt
        frames = _QFORMER_VIDEO_FRAMES
        prompt = torch.arange(1, _QFORMER_PROMPT_LEN + 1)[None]
        recipes += [("qformer_input_ids", lambda: {"pixel_values": pixels(1, c, side, side), "qformer_input_ids": prompt}),
                    ("qformer_input_ids", lambda: {"pixel_values": pixels(1, frames, c, side, side),
                                                   "qformer_input_ids": prompt})]
    if "image_token_pooling" in takes:  # Molmo2: one crop's patches, each image token pooling a 2 x 2 window
        grid = side // p
        pooled = max(1, grid // 2)
        windows = (torch.arange(pooled * 2 * pooled * 2).reshape(pooled, 2, pooled, 2).permute(0, 2, 1, 3)
                   .reshape(pooled * pooled, 4))
        windows = windows // (pooled * 2) * grid + windows % (pooled * 2)  # indices in the crop's grid x grid patches
        recipes.append(("image_token_pooling", lambda: {
            "pixel_values": pixels(1, grid * grid, c * p * p), "image_token_pooling": windows,
            "image_grids": torch.tensor([[pooled, pooled, 0, 0]]), "image_num_crops": torch.tensor([1])}))
    if "target_sizes" in takes:  # MiniCPM-V: the patch grid of each image
        recipes.append(("target_sizes", lambda: {"pixel_values": pixels(1, c, side, side),
                                                 "target_sizes": torch.tensor([[side // p, side // p]])}))
    high = {}
    if "high_res_pixel_values" in takes:  # DeepSeek-VL hybrid: the image again, at the high-res tower's size
        high_side = _vision_facts(getattr(model.config, "high_res_vision_config", None) or model.config)["image"]
        high = {"high_res_pixel_values": (1, c, high_side, high_side)}
    recipes.append(("pixel_values", lambda: {"pixel_values": pixels(1, c, side, side),
                                             **{k: pixels(*shape) for k, shape in high.items()}}))
    recipes.append(("pixel_values", lambda: {"pixel_values": pixels(1, 1, c, side, side)}))
    # Fuyu: the image as its flattened patches [1, patches, C * patch * patch], which a linear layer embeds
    recipes.append(("pixel_values", lambda: {"pixel_values": pixels(1, (side // p) ** 2, c * p * p)}))
    if t > 1:  # Inkling: one [temporal patch, patch, patch, C] block per image token, channels last
        recipes.append(("pixel_values", lambda: {"pixel_values": pixels((side // p) ** 2, t, p, p, c)}))
    dry[0] = True
    fitting = [(kind, make) for kind, make in recipes if set(make()) <= names]
    dry[0] = False
    return fitting


def _audio_recipe(model: torch.nn.Module, features: Callable[..., torch.Tensor]) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """The ``("audio", make)`` pairs of a model that takes ``input_features`` beside an audio placeholder token:
    ``input_features [1, mel bins, frames]`` (the encoder's ``2 * max_source_positions`` frames, else 1 s at
    100 frames a second) and its mask of ones under the name forward gives it."""
    from hfexport_dynamo import forward_parameters

    names, takes_kwargs = forward_parameters(model)
    names = set(names)
    if "input_features" not in names or _token_id(model.config, _AUDIO_TOKEN_KEYS) is None:
        return []
    owner = _feature_owner(model, "get_audio_features")
    if takes_kwargs and owner is not None:  # masks forward passes on through **kwargs
        names |= _params(owner.get_audio_features) & {*_AUDIO_MASKS, "padding_mask"}
    config = model.config
    audio = getattr(config, "audio_config", None) or getattr(getattr(config, "thinker_config", None),
                                                            "audio_config", None) or config
    mels = next((v for k in ("num_mel_bins", "feature_size", "n_mels", "input_dim")
                 if _is_int(v := getattr(audio, k, None)) and v > 0), 16)
    source = getattr(audio, "max_source_positions", None)
    lengths = [2 * source] if _is_int(source) and source > 0 else []
    lengths.append(100)
    recipes = []
    for frames in dict.fromkeys(lengths):
        def make(frames: int = frames) -> dict[str, Any]:
            media = {"input_features": features(1, mels, frames)}
            for mask in (n for n in (*_AUDIO_MASKS, "padding_mask") if n in names):
                media[mask] = torch.ones(1, frames, dtype=torch.long)
            return media
        recipes.append(("audio", make))
    return recipes


def _add_image_inputs(model: torch.nn.Module, inputs: dict[str, Any],
                      alt_inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], ImageInputs]:
    """``(inputs, alt_inputs, what was done)``: the text inputs of a multimodal case with images (or audio) added.

    The media are what the model's processor would build for one image at the size the vision config names
    (:data:`TINY_IMAGE` where it names none), from the config alone (:func:`_image_recipes`, :data:`MEDIA_KINDS`;
    audio: :func:`_audio_recipe`), drawn from a generator of their own (so the text is the same as without them). A
    model with a placeholder token (``config.image_token_id`` / ``image_token_index``; ``audio_token_id`` for
    audio) gets one image, in the first row: as many placeholders before that row's text as ``get_image_features``
    (``get_audio_features``) yields for it, and as many extra text tokens before the other rows' text. The image
    and its tokens are the same at both shapes (only the batch and the text part vary): LLaVA's
    ``get_image_features`` turns the features into a list of one tensor per image (``list(image_features)``),
    which makes torch.export specialize the number of images. A model without a placeholder token (GIT, ViLT)
    pairs each row with an image (``pixel_values [batch, C, H, W]``).

    Each kind the model's signatures allow is tried in turn: the eager forward runs at both shapes and once with
    other pixels (features); the first kind whose forward works, gives no NaNs and whose first output reads the
    pixels is kept. If none is, the text-only inputs are returned unchanged with the first kind's reason.
    """
    from hfexport_dynamo import dummy_inputs, forward_parameters

    def fallback(reason: str) -> tuple[dict[str, Any], dict[str, Any], ImageInputs]:
        return inputs, alt_inputs, ImageInputs(False, reason=" ".join(reason.split()))

    names = forward_parameters(model)[0]
    if not any(n in names for n in ("pixel_values", "input_features", "flattened_patches")):
        return fallback("forward takes no pixel_values or input_features")
    gen = torch.Generator().manual_seed(SEED + 1)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    image_token = _image_token_id(model.config)
    if image_token is None and "qformer_input_ids" in names:  # InstructBLIP-Video places its frames at a video token
        image_token = _token_id(model.config, _QFORMER_VIDEO_TOKEN_KEYS)
    if "action_embeds" in names and "pixel_attention_mask" in names:  # PI0: a camera image a row, and the actions
        attempts = [("cameras", functools.partial(_camera_rows, model, inputs, alt_inputs, draw))]
    elif image_token is None and ("pixel_values" in names or "flattened_patches" in names):
        def per_row() -> tuple[list[dict[str, Any]], int]:
            if "pixel_values" not in names:  # Kosmos-2.5: each row's image as Pix2Struct's flattened patches
                rows = [{**x, "flattened_patches": _flattened_patches(model, x["input_ids"].shape[0], draw)}
                        for x in (inputs, alt_inputs)]
                return _with_per_row_image_masks(model, rows, names, gen)
            rows = [{**x, "pixel_values": dummy_inputs(model, x["input_ids"].shape[0], SEQ_LEN, generator=gen,
                                                       modality="vision", default_image_size=TINY_IMAGE)["pixel_values"]}
                    for x in (inputs, alt_inputs)]
            return _with_per_row_image_masks(model, rows, names, gen)
        attempts: list[tuple[str, Callable[[], tuple[list[dict[str, Any]], int]]]] = [("per_row", per_row)]
    else:
        recipes = [(kind, make, image_token, "get_image_features") for kind, make in _image_recipes(model, draw)
                   if image_token is not None]
        audio_token = _token_id(model.config, _AUDIO_TOKEN_KEYS)
        recipes += [(kind, make, audio_token, "get_audio_features") for kind, make in _audio_recipe(model, draw)]
        if not recipes:
            return fallback("no placeholder token id in the config (image_token_id, audio_token_id) for the "
                            "media inputs forward takes")

        def placed(make: Callable[[], dict[str, Any]], kind: str, token: int,
                   method: str) -> tuple[list[dict[str, Any]], int]:
            media = [make(), make()]  # other values at the alt shape
            tokens = (_qformer_query_count(model, media[0]) if kind == "qformer_input_ids"
                      else _feature_count(model, media[0], method))
            both = [_with_media_tokens(x, mx, token, dummy_inputs(
                model, x["input_ids"].shape[0] - 1, tokens, generator=gen, modality="text",
                max_vocab=TINY_VOCAB)["input_ids"]) for x, mx in zip((inputs, alt_inputs), media, strict=True)]
            if kind == "image_grid_thw":
                both = [_with_mrope_positions(model, x, token, names) for x in both]
            elif kind == "target_sizes" and "mm_token_type_ids" in names:  # MiniCPM-V 4.7's M-RoPE
                both = [_with_mrope_positions(model, x, token, names) for x in both]
            return both, tokens
        attempts = [(kind, functools.partial(placed, make, kind, token, method))
                    for kind, make, token, method in recipes]
    first_reason: str | None = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        for kind, attempt in attempts:
            gen.manual_seed(SEED + 1)  # each kind draws from the start: a plain image is the same as before kinds
            try:
                with_media, tokens = attempt()
            except Exception as exc:  # noqa: BLE001 - a recipe that fails gives its reason; the next one is tried
                first_reason = first_reason or _first_line(exc)
                continue
            reason = _reads_media(model, with_media)
            if reason is None:
                return with_media[0], with_media[1], ImageInputs(True, tokens_per_image=tokens, kind=kind)
            first_reason = first_reason or reason
    return fallback(first_reason or "no media recipe fits the model's forward")


def _camera_rows(model: torch.nn.Module, inputs: dict[str, Any], alt_inputs: dict[str, Any],
                 draw: Callable[..., torch.Tensor]) -> tuple[list[dict[str, Any]], int]:
    """``(rows, tokens)``: PI0's text inputs with one camera image a row (``pixel_values [batch, 1, C, H, W]``,
    ``pixel_attention_mask [batch, 1]`` of ones), its ``tokens`` placeholders (its PaliGemma's
    ``vlm_config.image_token_id``) prefixed to every row, and the ``action_embeds [batch, 1 + chunk_size, dit
    width]`` (the robot state's and the noisy actions' embeddings) its forward requires."""
    config = model.config
    vlm = config.vlm_config
    facts = _vision_facts(vlm)
    c, side = facts["channels"], facts["image"]
    with torch.no_grad():
        tokens = model.vlm.get_image_features(draw(1, c, side, side)).pooler_output.shape[1]
    rows = []
    for x in (inputs, alt_inputs):
        batch = x["input_ids"].shape[0]
        y = _with_media_tokens(x, {}, vlm.image_token_id, torch.full((batch - 1, tokens), vlm.image_token_id))
        y.update(pixel_values=draw(batch, 1, c, side, side),
                 pixel_attention_mask=torch.ones(batch, 1, dtype=torch.bool),
                 action_embeds=draw(batch, 1 + config.chunk_size, config.dit_config.hidden_size))
        rows.append(y)
    return rows, tokens


def _flattened_patches(model: torch.nn.Module, batch: int, draw: Callable[..., torch.Tensor]) -> torch.Tensor:
    """One image a row as Pix2Struct's processor flattens it (Kosmos-2.5): ``[batch, patches, 2 +
    patch_embed_hidden_size]``, each patch its row and column (from 1; 0 pads) and its ``16 x 16 x 3`` pixels (the
    default ``patch_embed_hidden_size``, 768; a square of that many RGB pixels otherwise), the patches of a
    :data:`TINY_IMAGE` image."""
    vision = getattr(model.config, "vision_config", None) or model.config
    width = getattr(vision, "patch_embed_hidden_size", None) or 768
    patch = math.isqrt(width // 3)
    side = max(1, TINY_IMAGE // patch)
    rows, cols = torch.meshgrid(torch.arange(side) + 1, torch.arange(side) + 1, indexing="ij")
    where = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1).float()
    return torch.cat([where.expand(batch, -1, -1), draw(batch, side * side, width)], dim=-1)


def _with_per_row_image_masks(model: torch.nn.Module, rows: list[dict[str, Any]], names: list[str],
                              gen: torch.Generator) -> tuple[list[dict[str, Any]], int]:
    """``(rows, tokens)``: the per-row image inputs ``rows`` (``pixel_values [batch, C, H, W]``) with the mask that
    says where each row's text reads its image, where forward takes one (else unchanged, 0 tokens): IDEFICS's
    cross-attention ``image_attention_mask [batch, seq, images]`` (every token sees its row's one image, ``pixel_values
    [batch, 1, C, H, W]``), or Kosmos-2's ``image_embeds_position_mask [batch, seq]``, ones at the
    ``config.latent_query_num`` (64) positions its processor puts before the text, where the image features replace
    the embeddings (``tokens``: those positions, prefixed to each row as text ids)."""
    from hfexport_dynamo import dummy_inputs

    if "image_attention_mask" in names:
        return [{**x, "pixel_values": x["pixel_values"][:, None], "image_attention_mask": torch.ones(
            *x["input_ids"].shape, 1, dtype=torch.long)} for x in rows], 0
    queries = getattr(model.config, "latent_query_num", None)
    if "image_embeds_position_mask" not in names or not _is_int(queries) or queries <= 0:
        return rows, 0
    out = []
    for x in rows:
        batch, seq = x["input_ids"].shape
        filler = dummy_inputs(model, batch, queries, generator=gen, modality="text", max_vocab=TINY_VOCAB)["input_ids"]
        y = _with_media_tokens(x, {}, 0, filler[1:])  # the other token inputs get `queries` columns in front
        y["input_ids"] = torch.cat([filler.to(x["input_ids"].dtype), x["input_ids"]], dim=1)
        y["image_embeds_position_mask"] = torch.cat([torch.ones(batch, queries, dtype=torch.long),
                                                     torch.zeros(batch, seq, dtype=torch.long)], dim=1)
        out.append(y)
    return out, queries


_QFORMER_VIDEO_TOKEN_KEYS = ("video_token_id", "video_token_index")
_QFORMER_VIDEO_FRAMES = 4  # InstructBLIP-Video's processor samples 4 frames a video
_QFORMER_PROMPT_LEN = 8  # the Q-Former's instruction, in its own (BERT) vocabulary


def _qformer_query_count(model: torch.nn.Module, media: Mapping[str, Any]) -> int:
    """Placeholder tokens of one image of a Q-Former model (InstructBLIP: ``config.num_query_tokens``; InstructBLIP-Video:
    as many per frame of ``pixel_values [1, frames, C, H, W]``): its base model has no ``get_image_features``."""
    queries = getattr(model.config, "num_query_tokens", None)
    if not _is_int(queries) or queries <= 0:
        raise ValueError(f"{type(model).__name__} takes qformer_input_ids but its config has no num_query_tokens")
    pixels = media["pixel_values"]
    return queries * (pixels.shape[1] if pixels.dim() == 5 else 1)


def _with_mrope_positions(model: torch.nn.Module, inputs: dict[str, Any], token: int,
                          names: list[str]) -> dict[str, Any]:
    """``inputs`` of a Qwen-VL-style model (MiniCPM-V 4.7's too, from its ``target_sizes``) with the processor's
    ``mm_token_type_ids`` (0 text, 1 image) or, where
    the model has a ``get_rope_index`` and forward takes ``position_ids``, with the M-RoPE ``position_ids`` ``[3,
    batch, seq]`` it computes from them (as generation does): forward then skips that computation, a Python loop over
    the token types that torch.export cannot trace on an input."""
    types = (inputs["input_ids"] == token).long()
    owner = _feature_owner(model, "get_rope_index")
    if owner is None or "position_ids" not in names:
        return {**inputs, "mm_token_type_ids": types} if "mm_token_type_ids" in names else inputs
    takes = _params(owner.get_rope_index)
    given = {"mm_token_type_ids": types, "image_grid_thw": inputs.get("image_grid_thw"),
             "target_sizes": inputs.get("target_sizes"), "attention_mask": inputs.get("attention_mask")}
    with torch.no_grad():
        positions = owner.get_rope_index(inputs["input_ids"], **{k: v for k, v in given.items() if k in takes})[0]
    if positions.is_floating_point() and torch.equal(positions, positions.round()):
        positions = positions.long()  # Qwen3-Omni computes whole positions in float32; an export takes ids as long
    return {**inputs, "position_ids": positions}


def _reads_media(model: torch.nn.Module, with_media: list[dict[str, Any]]) -> str | None:
    """None when the eager forward runs at both shapes without NaNs and its first output changes with the media's
    float input (pixels or features); else why not (one line)."""
    key = next((k for k in ("pixel_values", "flattened_patches") if k in with_media[0]), "input_features")
    other = {**with_media[0], key: with_media[0][key] + 1.0}
    try:
        with torch.no_grad():
            outs = [model(**kwargs) for kwargs in (*with_media, other)]
    except Exception as exc:  # noqa: BLE001 - any failure is a reason
        return _first_line(exc)
    if any(_has_nan(out) for out in outs):
        return "eager forward with images gives NaN outputs"
    first, moved = _first_float_tensor(outs[0]), _first_float_tensor(outs[2])
    if first is None or moved is None or first.shape != moved.shape or torch.equal(first, moved):
        return f"the first output does not depend on {key}"
    return None


# --------------------------------------------------------------------------- building


def _model_class(case: ZooCase) -> type[torch.nn.Module]:
    import transformers

    try:
        return getattr(transformers, case.class_name)
    except Exception:  # noqa: BLE001 - fall back to the model's own module
        pass
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    try:
        module = importlib.import_module(f"transformers.models.{model_type_to_module_name(case.model_type)}")
        return getattr(module, case.class_name)
    except Exception as exc:  # noqa: BLE001
        raise NotInstantiable(f"cannot import {case.class_name}: {_fmt(exc)}") from exc


_ZERO_INIT_DRAWN = ("router", "mm_input_projection")
_ZERO_INIT_GATES = ("alpha_cross_attn", "alpha_dense")
"""IDEFICS's tanh gates of its cross-attention to the images, zero at init (``alpha_initializer="zeros"``): the text
would not read the images. A trained gate is open: they are drawn from N(0, 1)."""


def _draw_zero_routers(model: torch.nn.Module) -> list[str]:
    """Draw router weights that a model's init leaves all zero from N(0, 0.02) (in place; the names drawn).

    A zero router (AfMoE's ``router.gate``) scores every expert the same, so top-k routing is decided by how a
    runtime breaks ties, which differs between PyTorch and ONNX Runtime: a mismatch of the tiny model only, since a
    trained router has no such ties. So is a multimodal projection that init leaves all zero (Gemma 3's
    ``mm_input_projection_weight``): image features of zeros would not depend on the pixels; and so are IDEFICS's
    cross-attention gates (:data:`_ZERO_INIT_GATES`). Runs under
    :func:`build_case`'s seeded RNG, so cases stay reproducible.
    """
    drawn = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and param.is_floating_point() and any(key in name for key in _ZERO_INIT_DRAWN) \
                    and not param.any():
                param.normal_(0.0, 0.02)
                drawn.append(name)
            elif name.rsplit(".", 1)[-1] in _ZERO_INIT_GATES and param.is_floating_point() and not param.any():
                param.normal_(0.0, 1.0)
                drawn.append(name)
    return drawn


def build_case(case_id: str) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """Build a zoo case: tiny eval-mode model and two sets of dummy forward kwargs.

    The result is a pure function of ``case_id``: weights are initialised after
    ``torch.manual_seed(0)`` and inputs come from a generator seeded with 0, so two
    calls give identical weights and inputs.  The global RNG state is restored.

    Args:
        case_id: ``"<model_type>/<ClassName>"`` as listed by :func:`list_cases`.

    Returns:
        ``(model, inputs, alt_inputs)``: the model in eval mode (float32, CPU), forward
        kwargs at batch 2, and forward kwargs at batch 3 (with a different sequence
        length where the modality has one) for dynamic-shape checks; the sizes of
        :func:`case_shapes` (batch 9 and 10 for the case ``sample_cases(0)`` draws).

    Raises:
        UnknownCaseError: If ``case_id`` is not listed.
        NotInstantiable: If the tiny config, the model or its inputs cannot be built.
            The eager forward is not run here (see :func:`check_instantiable`), except on a multimodal case's
            inputs with images, which it keeps only if that forward works; :func:`image_inputs` of the model
            says whether the case got images, and why not.
    """
    case = get_case(case_id)
    if case.modality == "other":
        raise NotInstantiable(
            f"no dummy-input recipe for task {case.task!r} of model type {case.model_type!r}"
        )
    config = tiny_config(case.model_type, case.task, keep_image_size=case.modality == "vision",
                         with_vision=case.modality == "multimodal")
    model_cls = _model_class(case)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        try:
            model = model_cls(config)
        except Exception as exc:  # noqa: BLE001
            raise NotInstantiable(f"model construction fails: {_fmt(exc)}") from exc
        _draw_zero_routers(model)
    model = model.float().eval()
    inputs, alt_inputs = _make_inputs(case, model, torch.Generator().manual_seed(SEED))
    if case.modality == "multimodal":
        inputs, alt_inputs = _with_word_boxes(case, model, inputs, alt_inputs)
        inputs, alt_inputs = _with_canvas(model, inputs, alt_inputs)
        inputs, alt_inputs, images = _add_image_inputs(model, inputs, alt_inputs)
        setattr(model, IMAGE_INPUTS_ATTR, images)
    return model, inputs, alt_inputs


def _with_canvas(model: torch.nn.Module, inputs: dict[str, Any],
                 alt_inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A diffusion model's text inputs with the canvas it refines, ``decoder_input_ids [batch, canvas_length]``
    (random ids below the tiny vocab, the same generator at both shapes): without one DiffusionGemma's forward draws
    the canvas with ``torch.randint`` (two eager runs differed by 6.0, the export by 7.2). Models whose config has no
    ``canvas_length`` or whose forward takes no ``decoder_input_ids`` are unchanged."""
    from hfexport_dynamo import forward_parameters

    length = getattr(model.config, "canvas_length", None)
    if not (_is_int(length) and length > 0) or "decoder_input_ids" not in forward_parameters(model)[0]:
        return inputs, alt_inputs
    gen = torch.Generator().manual_seed(SEED + 3)
    return tuple({**x, "decoder_input_ids": torch.randint(0, TINY_VOCAB, (x["input_ids"].shape[0], length),
                                                          generator=gen)} for x in (inputs, alt_inputs))  # type: ignore[return-value]


_UNIT_BOXES = ("udop",)
"""Model types whose word boxes are fractions of the page (UDOP clips them to ``[0, 1]``); the LayoutLM family's are
integers of a 0-1000 grid."""


def _with_word_boxes(case: ZooCase, model: torch.nn.Module, inputs: dict[str, Any],
                     alt_inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A multimodal document model's text inputs with the word boxes its processor gives each token: ``bbox
    [batch, seq, 4]`` ``(x0, y0, x1, y1)`` with ``x0 <= x1`` and ``y0 <= y1``, drawn from a generator of their own
    (the other inputs are unchanged). UDOP requires them (``ValueError: Bbox is required for horizontal relative
    position bias`` without); a forward that takes no ``bbox`` gets none."""
    from hfexport_dynamo import forward_parameters

    if "bbox" not in forward_parameters(model)[0]:
        return inputs, alt_inputs
    gen = torch.Generator().manual_seed(SEED + 2)
    unit = case.model_type in _UNIT_BOXES

    def boxes(ids: torch.Tensor) -> torch.Tensor:
        corners = torch.rand(*ids.shape, 2, 2, generator=gen).sort(dim=-2).values  # [.., (low, high), (x, y)]
        corners = corners.flatten(-2)  # x0, y0, x1, y1
        return corners if unit else (corners * 1000).long()

    return tuple({**x, "bbox": boxes(x["input_ids"])} for x in (inputs, alt_inputs))  # type: ignore[return-value]


def _has_nan(output: Any) -> bool:
    if isinstance(output, torch.Tensor):
        return output.is_floating_point() and bool(torch.isnan(output).any())
    if isinstance(output, Mapping):
        return any(_has_nan(v) for v in output.values())
    if isinstance(output, (list, tuple)):
        return any(_has_nan(v) for v in output)
    return False


def _first_line(exc: BaseException, limit: int = 200) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_eager(model: torch.nn.Module, inputs: dict[str, Any], alt_inputs: dict[str, Any]) -> tuple[Any, Any]:
    """Run a built case's eager forward at both input shapes (without gradients).

    Args:
        model: the case's model, from :func:`build_case`.
        inputs: its forward kwargs at batch 2.
        alt_inputs: its forward kwargs at the alt shape.

    Returns:
        ``(outputs, alt_outputs)``.

    Raises:
        NotInstantiable: either forward raises (the reason gives the first line of the error), or an output
            holds NaNs.
    """
    outs = []
    for name, kwargs in (("inputs", inputs), ("alt_inputs", alt_inputs)):
        try:
            with torch.no_grad():
                out = model(**kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure is a reason
            raise NotInstantiable(f"eager forward fails on {name}: {_first_line(exc)}") from exc
        if _has_nan(out):
            raise NotInstantiable(f"eager forward on {name} gives NaN outputs")
        outs.append(out)
    return outs[0], outs[1]


def run_eager(case_id: str) -> tuple[Any, Any]:
    """Build a case and run its eager forward at both input shapes.

    Args:
        case_id: ``"<model_type>/<ClassName>"``.

    Returns:
        ``(outputs, alt_outputs)`` of the forward at ``inputs`` and ``alt_inputs``.

    Raises:
        UnknownCaseError: If ``case_id`` is not listed.
        NotInstantiable: If building fails, either forward raises, or an output has NaNs.
    """
    return check_eager(*build_case(case_id))


def check_instantiable(case_id: str) -> str | None:
    """Check that a case builds and runs eagerly at both input shapes.

    Args:
        case_id: ``"<model_type>/<ClassName>"``.

    Returns:
        ``None`` if the eager forward works at both shapes, else a one-line reason.

    Raises:
        UnknownCaseError: If ``case_id`` is not listed.
    """
    try:
        run_eager(case_id)
    except NotInstantiable as exc:
        return exc.reason
    return None
