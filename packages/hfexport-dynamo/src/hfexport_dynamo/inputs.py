"""Dummy inputs built from a Transformers model's config, for exports without user inputs."""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["dummy_inputs", "forward_parameters"]


def forward_parameters(model: torch.nn.Module) -> tuple[list[str], bool]:
    """``(names of forward's named parameters, whether it takes **kwargs)``."""
    params = inspect.signature(model.forward).parameters.values()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def _sub(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config


def _first(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int | float | list | tuple) and not isinstance(value, bool):
            return value[0] if isinstance(value, list | tuple) else value
    return default


def dummy_inputs(model: torch.nn.Module, batch: int = 2, seq: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """Forward keyword arguments that fit ``model``'s config, seeded.

    Covers text encoders and decoders (``input_ids``, ``attention_mask`` with the last row right-padded,
    ``token_type_ids`` where forward takes it), vision (``pixel_values``), encoder-decoders
    (``decoder_input_ids``) and speech (``input_features`` / ``input_values``).

    Args:
        model: a ``PreTrainedModel`` (anything with ``.config`` and ``.main_input_name``).
        batch: batch size.
        seq: text sequence length (tokens).
        seed: seed of the generator used for ids and features.

    Returns:
        A dict of tensors: ids ``int64 [batch, seq]``, ``pixel_values`` ``float32 [batch, C, H, W]``,
        ``input_features`` ``float32 [batch, mel_bins, frames]``.

    Raises:
        ValueError: the model has no config, or its main input is not one of those above.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config: pass inputs explicitly")
    gen = torch.Generator().manual_seed(seed)
    names, _ = forward_parameters(model)
    main = getattr(model, "main_input_name", "input_ids")
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    inputs: dict[str, torch.Tensor] = {}
    if main == "input_ids" or ("input_ids" in names and main not in ("pixel_values", "input_features", "input_values")):
        text = _sub(config, "text_config")
        vocab = _first(text, "vocab_size", default=100)
        inputs["input_ids"] = torch.randint(3, max(vocab, 4), (batch, seq), generator=gen)
        if "attention_mask" in names:
            mask = torch.ones(batch, seq, dtype=torch.long)
            if batch > 1:
                mask[-1, seq - max(1, seq // 4):] = 0  # right padding on the last row
            inputs["attention_mask"] = mask
        if "token_type_ids" in names and _first(text, "type_vocab_size", default=0):
            inputs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
    elif main == "pixel_values":
        vision = _sub(config, "vision_config")
        size = _first(vision, "image_size", default=224)
        channels = _first(vision, "num_channels", default=3)
        inputs["pixel_values"] = torch.randn(batch, channels, size, size, generator=gen).to(dtype)
    elif main == "input_features":
        audio = _sub(config, "audio_config", "encoder_config")
        mel = _first(audio, "num_mel_bins", "feature_size", "input_feat_per_channel", default=80)
        frames = 2 * _first(audio, "max_source_positions", default=seq * 2)
        inputs["input_features"] = torch.randn(batch, mel, frames, generator=gen).to(dtype)
    elif main == "input_values":
        inputs["input_values"] = torch.randn(batch, 1600 + 160 * seq, generator=gen).to(dtype)
    else:
        raise ValueError(f"cannot build dummy inputs for main input {main!r} of {type(model).__name__}: "
                         "pass inputs explicitly")
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in names:
        vocab = _first(_sub(config, "decoder", "text_config"), "vocab_size", default=100)
        inputs["decoder_input_ids"] = torch.randint(3, max(vocab, 4), (batch, max(2, seq // 2)), generator=gen)
    return inputs
