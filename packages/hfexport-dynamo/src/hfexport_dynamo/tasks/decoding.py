"""What the greedy loops of every generative task share (decoders in :mod:`hfexport_dynamo.generation`,
encoder-decoders in ``_seq2seq``): the task names, the manifest's ``generation`` section, the generation config
merged with a call's options, transformers' logits processors and stopping criteria, and the checks of a
prompt against the export's bounds."""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping
from typing import Any

import torch

from .names import (
    AUDIO_TEXT_TO_TEXT,
    IMAGE_TEXT_TO_TEXT,
    MEDIA_TASKS,
    SPEECH_RECOGNITION,
    TASKS,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
)

__all__ = ["AUDIO_TEXT_TO_TEXT", "IMAGE_TEXT_TO_TEXT", "MEDIA_TASKS", "SPEECH_RECOGNITION", "TASKS", "TEXT2TEXT_GENERATION", "TEXT_GENERATION", "GenerationStats", "check_bounds",
           "check_prompt", "generation_manifest", "input_names", "logits_processors", "merged_generation_config",
           "stopping_criteria", "token_id_list"]



_SPEECH_OPTIONS = {"language", "task", "is_multilingual", "return_timestamps"}


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


class GenerationStats(dict):
    """Timings of the last :func:`generate` call: ``prefill_s``, ``decode_s``, ``new_tokens`` (per row),
    ``decode_steps``, ``decode_tokens_per_s`` (new tokens of the whole batch per second of decode) and, for decoders,
    ``decode_step_s`` (the seconds of each decode step, in order: step ``k`` writes cache position ``prompt + k``)."""


def merged_generation_config(section: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
    from transformers import GenerationConfig

    stored = dict(section.get("generation_config") or {})
    config = GenerationConfig.from_dict(stored)
    for name, value in stored.items():  # from_dict drops a model config's extra fields (Whisper's lang_to_id)
        if not hasattr(config, name):
            setattr(config, name, value)
    unused = config.update(**options)
    if section.get("encoder_input") == "input_features":  # Whisper's generate options, not GenerationConfig fields
        for name in _SPEECH_OPTIONS & set(unused):
            setattr(config, name, unused.pop(name))
    if unused:
        raise TypeError(f"unknown generation option(s) {', '.join(sorted(unused))}: pass GenerationConfig fields "
                        "(max_new_tokens, eos_token_id, repetition_penalty, ...)")
    if config.do_sample or (config.num_beams or 1) > 1:
        raise ValueError("hfexport generates greedily: pass do_sample=False and num_beams=1 (sampling and beam "
                         "search are not implemented over exported programs)")
    if config.max_new_tokens is None:
        raise ValueError("pass max_new_tokens (the number of tokens to generate)")
    return config


def greedy_tokens(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(-1)`` (``int64 [batch]``, the first maximum as torch's), computed by NumPy on a CPU tensor:
    torch's one-thread argmax over a vocabulary is 25-50x slower (32,000 scores: 110 us against 4 us; 151,936:
    416 against 8, torch 2.15 on this project's CPU), a per-token cost beside a decode step of a few ms."""
    if scores.device.type != "cpu" or scores.requires_grad:
        return scores.argmax(-1)
    return torch.from_numpy(scores.numpy().argmax(-1)).to(torch.long)


def next_greedy(sequences: torch.Tensor, logits: torch.Tensor, processors: Any, criteria: Any,
                unfinished: torch.Tensor, pad: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of transformers' greedy loop (``GenerationMixin._sample`` with ``do_sample=False``): the logits
    processors over the ids so far, the argmax, ``pad`` for the rows that have finished, then the stopping criteria.

    Args:
        sequences: ``int64 [batch, length]``, the ids so far.
        logits: ``[batch, vocab]`` of the last position (any float dtype; processed in float32).
        processors, criteria: transformers' ``LogitsProcessorList`` and ``StoppingCriteriaList``.
        unfinished: ``bool [batch]``, updated in place: a row that a criterion stops is finished.
        pad: the id written for finished rows (None: they keep their argmax).

    Returns:
        ``(sequences with the new column, the new ids int64 [batch])``.
    """
    scores = processors(sequences, logits.float())
    next_tokens = greedy_tokens(scores)
    if pad is not None:
        next_tokens = torch.where(unfinished, next_tokens, torch.tensor(pad, dtype=next_tokens.dtype))
    sequences = torch.cat([sequences, next_tokens[:, None]], -1)
    unfinished &= ~criteria(sequences, scores)
    return sequences, next_tokens


def token_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list | tuple) else [value])]


def logits_processors(config: Any, section: Mapping[str, Any], prompt_len: int, encoder_ids: Any,
                      attention_mask: torch.Tensor | None = None) -> Any:
    """transformers' own processors for ``config`` (``GenerationMixin._get_logits_processor``, which reads only
    these facts of the model), with ``config`` prepared as ``generate`` prepares it: ``max_length`` and
    ``min_length`` counted from the ``prompt_len`` ids the loop starts from (``ForcedEOSTokenLogitsProcessor``,
    ``MinLengthLogitsProcessor`` read them), the EOS ids as a tensor. ``attention_mask`` (``[batch, prompt]``, a
    decoder's): ``RepetitionPenaltyLogitsProcessor`` skips each row's left padding, as in ``model.generate``."""
    from transformers import GenerationMixin

    config = copy.deepcopy(config)
    config.max_length = prompt_len + config.max_new_tokens
    if config.min_new_tokens is not None:
        config.min_length = prompt_len + config.min_new_tokens
    eos = token_id_list(config.eos_token_id)
    config._eos_token_tensor = torch.tensor(eos) if eos else None

    model_config = types.SimpleNamespace(
        is_encoder_decoder=section["is_encoder_decoder"], vocab_size=section["vocab_size"],
        max_position_embeddings=section.get("max_position_embeddings"),
        get_text_config=lambda *a, **k: model_config)
    facts = types.SimpleNamespace(config=model_config, _merge_criteria_processor_list=lambda a, b: a)
    return GenerationMixin._get_logits_processor(facts, config, input_ids_seq_length=prompt_len,
                                                 encoder_input_ids=encoder_ids, device="cpu",
                                                 model_kwargs={} if attention_mask is None else
                                                 {"attention_mask": attention_mask})


def stopping_criteria(max_length: int, eos: list[int]) -> Any:
    from transformers.generation.stopping_criteria import (
        EosTokenCriteria,
        MaxLengthCriteria,
        StoppingCriteriaList,
    )

    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=max_length)])
    if eos:
        criteria.append(EosTokenCriteria(eos_token_id=torch.tensor(eos)))
    return criteria


def input_names(exported: Any, component: str) -> set[str]:
    return {i["name"] for i in exported.manifest["components"][component]["inputs"]}


def check_prompt(input_ids: Any, attention_mask: Any, config: Any, section: Mapping[str, Any],
                  what: str = "input_ids", decoder_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Refuse, before any program runs, a prompt the programs cannot take or the config cannot stop on.

    ``decoder_len``: an encoder-decoder's decoder start length; ``input_ids`` is then the encoder's input,
    bounded by ``section["max_source_len"]``, and the decoder's length is what ``max_cache_len`` bounds."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
        raise TypeError(f"{what} must be an integer tensor [batch, prompt], got "
                        f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} of shape "
                        f"{list(getattr(input_ids, 'shape', []))}")
    input_ids = input_ids.long()
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else torch.as_tensor(attention_mask).long()
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {list(attention_mask.shape)}, input_ids {list(input_ids.shape)}")
    batch, prompt = input_ids.shape
    if prompt == 0:
        raise ValueError(f"{what} holds no tokens (shape {list(input_ids.shape)}): give at least one token "
                         "(a decoder's BOS token, for an empty prompt)")
    if decoder_len is not None and not 1 <= prompt <= section["max_source_len"]:
        raise ValueError(f"{what} of {prompt} tokens: this export's encoder takes 1 to "
                         f"max_source_len={section['max_source_len']} tokens")
    check_bounds(batch, prompt if decoder_len is None else decoder_len, config, section,
                  "a prompt" if decoder_len is None else "a decoder start")
    vocab = section["vocab_size"]
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        raise ValueError(f"{what} holds ids outside the vocabulary [0, {vocab}): "
                         f"min {int(input_ids.min())}, max {int(input_ids.max())}")
    return input_ids, attention_mask


def check_bounds(batch: int, length: int, config: Any, section: Mapping[str, Any], what: str = "a prompt") -> None:
    """Refuse a batch beyond ``max_batch``, ``length`` ids plus ``max_new_tokens`` beyond ``max_cache_len``, and
    EOS or pad ids outside the vocabulary."""
    if batch > section["max_batch"]:
        raise ValueError(f"a batch of {batch} exceeds this export's max_batch={section['max_batch']}: split the "
                         "batch or re-export with a larger max_batch")
    if length + config.max_new_tokens > section["max_cache_len"]:
        raise ValueError(f"{what} of {length} tokens plus max_new_tokens={config.max_new_tokens} exceeds this "
                         f"export's max_cache_len={section['max_cache_len']}: shorten them, or re-export with "
                         f"max_cache_len >= {length + config.max_new_tokens}")
    vocab = section["vocab_size"]
    for name, ids in (("eos_token_id", token_id_list(config.eos_token_id)), ("pad_token_id", token_id_list(config.pad_token_id))):
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"{name}={bad if len(bad) > 1 else bad[0]} is outside the vocabulary [0, {vocab})")
