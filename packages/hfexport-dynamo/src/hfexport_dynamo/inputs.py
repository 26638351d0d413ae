"""Dummy inputs built from a Transformers model's config: the one builder, for exports without user inputs
and for the tiny-model zoo of hfexport-sweep."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["BATCH_INPUTS", "DECODER_TOKEN_INPUTS", "DEFAULT_AUDIO_SECONDS", "DEFAULT_MEL_FRAMES",
           "DEFAULT_SAMPLING_RATE", "IMAGE_LAYOUT_INPUTS", "IMAGE_SIZE_LISTS", "MODALITIES", "TOKEN_INPUTS", "dim_roles", "dummy_inputs", "forward_parameters",
           "max_positions", "shared_dims", "static_image_dims", "typical_size"]

MODALITIES = ("text", "text2text", "multimodal", "dual-encoder", "vision", "audio", "speech")
"""The kinds of inputs :func:`dummy_inputs` makes (its ``modality`` argument)."""

_TEXT = ("text", "text2text", "multimodal", "dual-encoder")
# Where a value may live in a composite config: the config itself first, then its sub-configs.
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config", "encoder", "decoder", "speech_config")


# Inputs laid out [batch, sequence, ...] along one text (or one decoder) sequence, and inputs whose dim 0 is the batch.
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds")
DECODER_TOKEN_INPUTS = ("decoder_input_ids", "decoder_attention_mask", "decoder_position_ids", "decoder_inputs_embeds")
BATCH_INPUTS = (*TOKEN_INPUTS, *DECODER_TOKEN_INPUTS, "pixel_values", "input_features", "input_values")


def dim_roles(inputs: Mapping[str, Any], model: Any = None) -> dict[tuple[str, int], str]:
    """``(input name, dim) -> role`` for the top-level tensor inputs whose layout is known:

    * ``"batch"``: dim 0 of the inputs named in :data:`BATCH_INPUTS`;
    * ``"sequence"`` / ``"decoder_sequence"``: dim 1 of :data:`TOKEN_INPUTS` / :data:`DECODER_TOKEN_INPUTS`;
    * ``"image_height"`` / ``"image_width"``: dims 2 and 3 of a 4-d ``pixel_values`` ``[batch, C, H, W]``;
    * ``"audio"``: dim 1 of ``input_values`` (raw samples), and of an ``attention_mask`` of the same length when
      no text goes with it (a Wav2Vec2's mask runs along the samples);
    * ``"frames"``: the time dim of a 3-d ``input_features`` (dim 2 of Whisper's ``[batch, mel bins, frames]``,
      dim 1 of ``[batch, frames, features]``: the dim that is not ``model.config``'s feature count), and
      ``attention_mask``'s dim 1 when it has that length and no text goes with it.

    Other inputs and dims have no role."""
    roles: dict[tuple[str, int], str] = {}
    for name, value in inputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        if name in BATCH_INPUTS:
            roles[(name, 0)] = "batch"
        if value.dim() >= 2 and name in TOKEN_INPUTS:
            roles[(name, 1)] = "sequence"
        elif value.dim() >= 2 and name in DECODER_TOKEN_INPUTS:
            roles[(name, 1)] = "decoder_sequence"
        elif name == "pixel_values" and value.dim() == 4:
            roles[(name, 2)], roles[(name, 3)] = "image_height", "image_width"
        elif name == "input_values" and value.dim() == 2:
            roles[(name, 1)] = "audio"
        elif name == "input_features" and value.dim() == 3:
            roles[(name, _frames_dim(value, model))] = "frames"
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not any(
            isinstance(inputs.get(n), torch.Tensor) for n in ("input_ids", "inputs_embeds")):
        for (name, dim), role in list(roles.items()):
            if role in ("audio", "frames") and int(inputs[name].shape[dim]) == int(mask.shape[1]):
                roles[("attention_mask", 1)] = role
    return roles


def _frames_dim(features: torch.Tensor, model: Any) -> int:
    """The time dim of a 3-d ``input_features``: the one that is not the config's feature count."""
    config = getattr(model, "config", None)
    count = _find(config, "num_mel_bins", "input_feat_per_channel", "feature_size") if config is not None else None
    if _is_int(count) and int(features.shape[1]) == count != int(features.shape[2]):
        return 2
    if _is_int(count) and int(features.shape[2]) == count != int(features.shape[1]):
        return 1
    return 2 if features.shape[1] <= features.shape[2] else 1


DEFAULT_SAMPLING_RATE = 16_000
"""Raw audio's samples per second where neither the config nor the input names one (speech models' 16 kHz)."""
DEFAULT_AUDIO_SECONDS = 30
"""The longest audio :func:`typical_size` plans for by default (Whisper's window)."""
DEFAULT_MEL_FRAMES = 3_000
"""Feature frames of :data:`DEFAULT_AUDIO_SECONDS` at 100 frames a second (a 10 ms hop, Whisper's 3,000)."""


def typical_size(model: Any, role: str) -> tuple[int, str] | None:
    """``(the largest size model.config describes for role, where it comes from)``, or None: the positions of a
    sequence (:func:`max_positions`, a hard limit; ``"config.max_position_embeddings"``); ``config.image_size`` (its height or width) for an image dim;
    :data:`DEFAULT_AUDIO_SECONDS` of raw audio at ``config.sampling_rate`` (default
    :data:`DEFAULT_SAMPLING_RATE`); Whisper's ``2 * max_source_positions`` mel frames, AST's ``max_length``, else
    :data:`DEFAULT_MEL_FRAMES`. Image and audio sizes are what the model is made for, not limits: a bound taken
    from them may be raised where the model allows."""
    if role in ("sequence", "decoder_sequence"):
        limit = max_positions(model, role)
        return (limit[0], f"config.{limit[1]}") if limit else None
    config = getattr(model, "config", None)
    if role in ("image_height", "image_width"):
        if config is None:
            return None
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", None) or getattr(config, "image_size", None)
        if isinstance(size, dict):
            size = size.get("height" if role == "image_height" else "width")
        elif isinstance(size, list | tuple) and len(size) >= 2:
            size = size[0 if role == "image_height" else 1]
        return (int(size), "config.image_size") if _is_int(size) and size > 0 else None
    if role == "audio":
        rate = _find(config, "sampling_rate") if config is not None else None
        if _is_int(rate) and rate > 0:
            return DEFAULT_AUDIO_SECONDS * rate, f"{DEFAULT_AUDIO_SECONDS} s at config.sampling_rate"
        return (DEFAULT_AUDIO_SECONDS * DEFAULT_SAMPLING_RATE,
                f"{DEFAULT_AUDIO_SECONDS} s at {DEFAULT_SAMPLING_RATE // 1000} kHz")
    if role == "frames":
        if config is not None and "whisper" in str(getattr(config, "model_type", "")):
            source = _find(config, "max_source_positions")
            if _is_int(source) and source > 0:
                return 2 * source, "2 * config.max_source_positions"
        length = _find(config, "max_length") if config is not None and str(
            getattr(config, "model_type", "")) == "audio-spectrogram-transformer" else None
        if _is_int(length) and length > 0:
            return length, "config.max_length"
        return DEFAULT_MEL_FRAMES, f"{DEFAULT_AUDIO_SECONDS} s of 10 ms frames"
    return None


def max_positions(model: Any, role: str = "sequence") -> tuple[int, str] | None:
    """``(the longest sequence model.config admits, the config field it comes from)`` for ``role`` (``"sequence"``:
    ``max_position_embeddings``, ``n_positions``; ``"decoder_sequence"``: ``max_target_positions`` first), or None
    (no config, or a model without a position limit such as T5)."""
    config = getattr(model, "config", None)
    if config is None or role not in ("sequence", "decoder_sequence"):
        return None
    names = ("max_position_embeddings", "n_positions")
    if role == "decoder_sequence":
        names = ("max_target_positions", *names)
    for name in names:
        value = _find(config, name)
        if _is_int(value) and value > 0:
            return value, name
    return None


def shared_dims(model: Any, inputs: Mapping[str, Any]) -> dict[str, dict[int, Any]]:
    """``{input name: {dim: torch.export.Dim}}``: one named ``Dim`` per role of :func:`dim_roles` (``batch``,
    ``sequence``, ``decoder_sequence``), shared by the token inputs (:data:`TOKEN_INPUTS`,
    :data:`DECODER_TOKEN_INPUTS`) whose example has the same size there, so that ``dynamic=True`` traces one symbol
    for the batch and one for the sequence (``Dim.AUTO`` gives ``attention_mask`` a batch of its own: the model
    indexes it rather than adding it to the embeddings). A sequence ``Dim`` has ``max`` = :func:`max_positions`.
    Roles with fewer than two such dims, or a size below 2 (torch.export specializes 0 and 1), are left out (they
    stay ``Dim.AUTO``); so are the batches of ``pixel_values`` and audio inputs, which a dual encoder takes
    independently of the text's.
    """
    from torch.export import Dim

    groups: dict[str, list[tuple[str, int]]] = {}
    for (name, dim), role in dim_roles(inputs).items():
        if name in TOKEN_INPUTS or name in DECODER_TOKEN_INPUTS:
            groups.setdefault(role, []).append((name, dim))
    out: dict[str, dict[int, Any]] = {}
    for role, members in groups.items():
        size = int(inputs[members[0][0]].shape[members[0][1]])
        members = [(n, d) for n, d in members if int(inputs[n].shape[d]) == size]
        if size < 2 or len(members) < 2:
            continue
        limit = max_positions(model, role)
        shared = Dim(role, min=1, max=limit[0]) if limit is not None and limit[0] >= size else Dim(role, min=1)
        for name, dim in members:
            out.setdefault(name, {})[dim] = shared
    return out


IMAGE_LAYOUT_INPUTS = ("image_grid_thw", "image_sizes", "spatial_shapes", "target_sizes", "image_merge_sizes")
"""Integer inputs a vision-language processor derives from the image size (Qwen-VL's patch grid ``[images, 3]``,
LLaVA-NeXT's and Pixtral's ``[images, 2]`` sizes in pixels, NaFlex's and MiniCPM-V's patch grids). The model reads
their values to split and place the patches (``.tolist()``, ``repeat_interleave``): torch.export cannot trace those
reads on an input, so the dynamo exporter bakes an integer tensor of these names into the program as a constant
(``manifest["fixed_kwargs"]``, as nested lists), as it bakes Python constants; a call with other values is refused
by name. With :func:`static_image_dims`, the image size is the export's."""
IMAGE_SIZE_LISTS = ("image_sizes",)
"""Baked :data:`IMAGE_LAYOUT_INPUTS` the traced model is given as nested Python lists (``[[H, W], ...]``), which it
iterates as it iterates the tensor (``for size in image_sizes``): sizes read from a tensor, even a constant one, are
data-dependent symbols in the trace (LLaVA-NeXT's ``select_best_resolution``, Pixtral's crops)."""


def static_image_dims(inputs: Mapping[str, Any]) -> dict[str, dict[int, Any]]:
    """``{"pixel_values": {dim: Dim.STATIC, ...}}``: with ``dynamic=True``, the dims of a ``pixel_values`` that
    comes with text (a :data:`TOKEN_INPUTS` tensor beside it: a vision-language model) are static but the first
    (the images, or the patches of a flattened layout such as Qwen-VL's ``[patches, C * t * p * p]``). Such a
    model's image size is fixed by its processor (the config's ``image_size``; anyres crops and tiles come in that
    size too), and ``Dim.AUTO`` on the height and width makes torch.export reason about sizes the model never sees
    (InternVL's pixel shuffle fails with a ``ValueRangeError``). ``{}`` when there is no such ``pixel_values``;
    a vision model's ``pixel_values`` (no text) keeps ``Dim.AUTO`` on every dim."""
    from torch.export import Dim

    pixels = inputs.get("pixel_values")
    if not (isinstance(pixels, torch.Tensor) and pixels.dim() >= 2
            and any(isinstance(inputs.get(name), torch.Tensor) for name in TOKEN_INPUTS)):
        return {}
    return {"pixel_values": dict.fromkeys(range(1, pixels.dim()), Dim.STATIC)}


def forward_parameters(model: torch.nn.Module) -> tuple[list[str], bool]:
    """``(names of forward's named parameters, whether it takes **kwargs)``."""
    params = inspect.signature(model.forward).parameters.values()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _find(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` set (not None) on ``config`` or, failing that, on one of its sub-configs."""
    subs = [config, *(s for n in _SUB_CONFIGS if (s := getattr(config, n, None)) is not None and hasattr(s, "to_dict"))]
    for sub in subs:
        for name in names:
            value = getattr(sub, name, None)
            if value is not None:
                return value
    return default


def _special_token_ids(tree: Any, out: set[int]) -> set[int]:
    """Every ``*_token_id(s)`` / ``*_token_index`` / ``*_token`` / ``*_patch_id`` (Molmo2's image placeholder,
    ``image_patch_id``) integer of a config dict, nested ones included."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if isinstance(value, dict) and key not in ("id2label", "label2id"):
                _special_token_ids(value, out)
            elif isinstance(key, str) and key.endswith(("_token_id", "_token_ids", "_token_index", "_token",
                                                        "_patch_id")):
                if _is_int(value):
                    out.add(value)
                elif isinstance(value, list):
                    out.update(v for v in value if _is_int(v))
    return out


def _vocab_size(config: Any) -> int | None:
    try:
        text = config.get_text_config(decoder=False)
    except Exception:  # noqa: BLE001 - an older or custom config
        text = config
    vocab = _find(text, "vocab_size") or _find(config, "vocab_size")
    return int(vocab[0] if isinstance(vocab, list | tuple) else vocab) if vocab else None


def _token_pool(config: Any, max_vocab: int | None) -> torch.Tensor:
    """The ids dummy text is drawn from: the vocabulary minus the special tokens (an image token id in the
    text would make a multimodal model look for images, an eos would end an eos-pooled sequence early)."""
    vocab = _vocab_size(config) or max_vocab or 100
    if max_vocab is not None:
        vocab = min(vocab, max_vocab)
    special = _special_token_ids(config.to_dict(), set())
    allowed = [i for i in range(vocab) if i not in special]
    return torch.tensor(allowed or list(range(vocab)))


def _infer_modality(model: torch.nn.Module, config: Any, names: list[str]) -> str:
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_ids" or ("input_ids" in names and main not in ("pixel_values", "input_features", "input_values")):
        return "text"  # an encoder-decoder gets decoder_input_ids too
    if main == "pixel_values":
        return "vision"
    if main in ("input_features", "input_values"):
        return "speech" if getattr(config, "is_encoder_decoder", False) else "audio"
    raise ValueError(f"cannot build dummy inputs for main input {main!r} of {type(model).__name__}: "
                     "pass inputs explicitly")


def dummy_inputs(model: torch.nn.Module, batch: int = 2, seq: int = 8, seed: int = 0, *,
                 generator: torch.Generator | None = None, modality: str | None = None, padding: bool = True,
                 decoder_seq: int | None = None, token_type_ids: bool | None = None, max_vocab: int | None = None,
                 default_image_size: int = 224) -> dict[str, Any]:
    """Forward keyword arguments that fit ``model``'s config, seeded.

    Covers text encoders and decoders (``input_ids`` drawn among the non-special tokens, ``attention_mask``,
    ``token_type_ids`` where forward takes them), encoder-decoders (``decoder_input_ids``; the encoder text ends
    with eos), vision (``pixel_values``), dual encoders (text and ``pixel_values``), and audio and speech
    (``input_values`` of ``200 * seq`` samples, or ``input_features``: Whisper's ``[batch, mel_bins,
    2 * max_source_positions]``, else ``[batch, 4 * seq frames, features]``).

    Args:
        model: a ``PreTrainedModel`` (anything with ``.config``, ``.forward`` and ``.main_input_name``).
        batch: batch size.
        seq: text sequence length (tokens); audio and speech lengths scale with it.
        seed: seed of the generator used for ids and features.
        generator: draw from this generator instead (``seed`` is then ignored): two calls sharing one
            generator give different values, as the zoo's trace and verification inputs do.
        modality: the kind of inputs, one of :data:`MODALITIES` (default: from ``model.main_input_name``).
            ``"multimodal"`` gives a multimodal model text only; ``"text2text"`` adds ``decoder_attention_mask``.
        padding: right-pad the last row of ``attention_mask`` (a quarter of ``seq``) when ``batch > 1``.
        decoder_seq: length of ``decoder_input_ids`` (default ``max(2, seq // 2)``). None are made for an
            eos-pooled sequence-classification head, which derives them from ``input_ids``.
        token_type_ids: make ``token_type_ids`` (zeros) where forward takes them: if the config names a type
            vocabulary larger than 0 (``None``, the default), also when it names none (``True``), never (``False``).
        max_vocab: draw token ids below this bound too.
        default_image_size: image height and width when the config names none.

    Returns:
        A dict of tensors: ids ``int64 [batch, seq]``, ``pixel_values`` ``[batch, C, H, W]``, ``input_values``
        ``[batch, samples]``, ``input_features`` (floats in the model's dtype); for ViTMAE also ``noise``
        ``float32 [batch, patches]`` (uniform in [0, 1)), which fixes its random patch masking.

    Raises:
        ValueError: the model has no config, its main input is none of those above, or its forward takes none
            of the inputs of ``modality``.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config: pass inputs explicitly")
    names, _ = forward_parameters(model)
    modality = modality or _infer_modality(model, config, names)
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    inputs: dict[str, Any] = {}

    def ids(rows: int, length: int) -> torch.Tensor:
        pool = _token_pool(config, max_vocab)
        return pool[torch.randint(len(pool), (rows, length), generator=gen)]

    def pixels() -> torch.Tensor:
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", None) or getattr(config, "image_size", None) or default_image_size
        if isinstance(size, dict):
            size = (size.get("height", default_image_size), size.get("width", default_image_size))
        height, width = (size, size) if _is_int(size) else tuple(size)[:2]
        channels = getattr(vision, "num_channels", None) or 3
        return torch.randn(batch, channels, height, width, generator=gen).to(dtype)

    def features() -> torch.Tensor:
        mels, max_source = _find(config, "num_mel_bins"), _find(config, "max_source_positions")
        if mels and max_source and "whisper" in str(getattr(config, "model_type", "")):
            return torch.randn(batch, mels, 2 * max_source, generator=gen).to(dtype)  # Whisper's 30 s window
        size = _find(config, "input_feat_per_channel") or mels or _find(config, "feature_size") or 80
        size *= _find(config, "input_channels") or 1
        return torch.randn(batch, 4 * seq, size, generator=gen).to(dtype)

    if modality in _TEXT:
        inputs["input_ids"] = ids(batch, seq)
        if "attention_mask" in names:
            mask = torch.ones(batch, seq, dtype=torch.long)
            if padding and batch > 1:
                mask[-1, seq - max(1, seq // 4):] = 0  # right padding on the last row
            inputs["attention_mask"] = mask
        types = _find(config, "type_vocab_size")
        if "token_type_ids" in names and token_type_ids is not False and (
                (types or 0) > 0 if types is not None else token_type_ids):
            inputs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
        if modality == "dual-encoder" and "pixel_values" in names:
            inputs["pixel_values"] = pixels()
    elif modality == "vision":
        inputs["pixel_values"] = pixels()
        patch, ratio = _find(config, "patch_size"), _find(config, "mask_ratio")
        if "noise" in names and _is_int(patch) and ratio and _find(config, "masked_unit_size") is None:
            # ViTMAE masks random patches, drawn inside forward unless `noise` is given: an input makes the
            # masking the same in eager and exported runs (random_masking's documented use of `noise`)
            height, width = inputs["pixel_values"].shape[-2:]
            inputs["noise"] = torch.rand(batch, (height // patch) * (width // patch), generator=gen)
    elif modality in ("audio", "speech"):
        # a speech-to-text model reads features first, an audio encoder its raw waveform
        order = ("input_features", "input_values") if modality == "speech" else ("input_values", "input_features")
        name = next((n for n in order if n in names), None)
        if name == "input_values":
            inputs[name] = torch.randn(batch, 200 * seq, generator=gen).to(dtype)
        elif name == "input_features":
            inputs[name] = features()
    else:
        raise ValueError(f"unknown modality {modality!r}: expected one of {', '.join(MODALITIES)}")
    if not inputs:
        raise ValueError(f"forward takes none of the {modality} inputs dummy_inputs knows how to make")

    if encoder_decoder and "input_ids" in inputs:
        eos = getattr(config, "eos_token_id", None)
        if _is_int(eos) and 0 <= eos < (_vocab_size(config) or 0):
            inputs["input_ids"][:, -1] = eos  # eos-pooled heads (the BART family) need one eos per row
    pooled_head = type(model).__name__.endswith("ForSequenceClassification")
    if "decoder_input_ids" in names and not pooled_head and (encoder_decoder or modality in ("text2text", "speech")):
        length = decoder_seq if decoder_seq is not None else max(2, seq // 2)
        inputs["decoder_input_ids"] = ids(batch, length)
        if "decoder_attention_mask" in names and modality == "text2text":
            inputs["decoder_attention_mask"] = torch.ones(batch, length, dtype=torch.long)
    return inputs
