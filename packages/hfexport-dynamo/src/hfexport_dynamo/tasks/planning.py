"""What the plans of every generative task share: the bounds (``max_cache_len``, ``max_batch``, ``prefill_chunk``)
checked against the model, the example prompt a decoder is traced with, the refusal of a model that cannot
generate, and the manifest's ``generation`` section (so that a loaded artifact generates without the model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hfexport.plugin import InvalidInputError

from .names import TEXT_GENERATION

__all__ = ["check_generative", "check_prefill_chunk", "checked_bounds", "example_prompt", "generation_manifest",
           "positions_from_mask"]

DEFAULT_MAX_CACHE_LEN = 4096  # the cap of the default (the model's positions, else this)
SEQ2SEQ_DEFAULT_MAX_CACHE_LEN = 256  # encoder-decoders still export prefill + decode with a growing cache
DEFAULT_MAX_BATCH = 1
DEFAULT_PREFILL_CHUNK = 256
TRACE_BATCH, TRACE_PROMPT = 2, 6  # not 0 or 1: torch.export specializes those sizes


def _refuse(model: Any, task: str, why: str, instead: str) -> InvalidInputError:
    return InvalidInputError(f"{type(model).__name__} cannot be exported for task {task!r}: {why}; {instead}")


def check_generative(model: Any, task: str) -> None:
    """Refuse, before anything is traced, a model without a generation head, or a decoder for an encoder-decoder
    task and the reverse (``hfexport.InvalidInputError``: what to load or export instead)."""
    from transformers import GenerationMixin

    config = getattr(model, "config", None)
    if config is None:
        raise _refuse(model, task, "it has no Transformers config", "export a PreTrainedModel")
    is_seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    if not isinstance(model, GenerationMixin):
        raise _refuse(model, task, "it has no language-modeling head (it is not a GenerationMixin)",
                      "load it with AutoModelForCausalLM (decoders) or AutoModelForSeq2SeqLM (encoder-decoders)")
    if task == TEXT_GENERATION and is_seq2seq:
        raise _refuse(model, task, "it is an encoder-decoder", "export it with task='text2text-generation' "
                      "(or 'automatic-speech-recognition' for speech)")
    if task != TEXT_GENERATION and not is_seq2seq:
        raise _refuse(model, task, "it is a decoder without an encoder", "export it with task='text-generation'")


def checked_bounds(model: Any, max_cache_len: int | None, max_batch: int | None, *,
            default_cap: int = DEFAULT_MAX_CACHE_LEN) -> tuple[int, int]:
    """``(max_cache_len, max_batch)`` checked against the model: the default length is the model's positions
    (``max_position_embeddings``), capped at ``default_cap`` and at a sliding window."""
    config = model.config.get_text_config(decoder=True)
    positions = (getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
                 or getattr(config, "max_target_positions", None))  # Whisper's decoder
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    sliding = bool(window) and ("sliding_attention" in layer_types or getattr(config, "use_sliding_window", True))
    if max_cache_len is None:
        max_cache_len = min(positions or default_cap, default_cap, *((window,) if sliding else ()))
    max_batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
    for name, value, least in (("max_cache_len", max_cache_len, TRACE_PROMPT + 2), ("max_batch", max_batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if positions and max_cache_len > positions:
        raise ValueError(f"max_cache_len={max_cache_len} exceeds the model's {positions} positions "
                         "(max_position_embeddings): lower it")
    if sliding and window < max_cache_len:
        raise ValueError(f"max_cache_len={max_cache_len} exceeds the sliding window ({window} tokens), past "
                         "which the cache rolls over: export with max_cache_len <= sliding_window")
    return max_cache_len, max_batch


def example_prompt(model: Any, inputs: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill's example ``input_ids`` and ``attention_mask`` (the user's, or seeded ones from the config)."""
    if inputs is not None:
        if not isinstance(inputs, Mapping) or not isinstance(inputs.get("input_ids"), torch.Tensor):
            raise InvalidInputError("a text-generation export takes inputs={'input_ids': LongTensor[batch, prompt], "
                                    "'attention_mask': ...} (the prompt to trace with), or none")
        ids = inputs["input_ids"]
        return ids, inputs.get("attention_mask", torch.ones_like(ids))
    vocab = model.config.get_text_config(decoder=True).vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3 if vocab > 3 else 0, vocab, (TRACE_BATCH, TRACE_PROMPT), generator=generator)
    return ids, torch.ones_like(ids)



def check_prefill_chunk(prefill_chunk: int | None, max_cache_len: int) -> int:
    """``prefill_chunk`` checked (default ``min(256, max_cache_len)``).

    Raises:
        ValueError: not an int from 2 to ``max_cache_len``.
    """
    prefill_chunk = min(DEFAULT_PREFILL_CHUNK, max_cache_len) if prefill_chunk is None else prefill_chunk
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or not 2 <= prefill_chunk <= max_cache_len:
        raise ValueError(f"prefill_chunk must be an int from 2 to max_cache_len={max_cache_len}, got {prefill_chunk!r}")
    return prefill_chunk




def generation_manifest(model: Any, max_cache_len: int, max_batch: int, cache_layers: int) -> dict[str, Any]:
    """The manifest's ``generation`` section: bounds, the cache layout, the generation config and the model
    facts transformers' logits processors read (so that a loaded artifact generates without the model)."""
    config = model.config
    text = config.get_text_config(decoder=True)
    return {
        "max_cache_len": max_cache_len,
        "max_batch": max_batch,
        "cache_layers": cache_layers,
        "vocab_size": text.vocab_size,
        "is_encoder_decoder": bool(getattr(config, "is_encoder_decoder", False)),
        "max_position_embeddings": getattr(text, "max_position_embeddings", None),
        "generation_config": model.generation_config.to_diff_dict() if getattr(model, "generation_config", None)
        else {},
    }


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded prompt, as transformers' generate makes them (0 at padding)."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
