"""Generation for encoder-decoders (``task="text2text-generation"``: T5, BART; ``"automatic-speech-recognition"``:
Whisper): the three programs greedy decoding runs, and how the one greedy loop runs them.

Components (all from one model; the KV caches cross the program boundary as tuples of tensors and are a
transformers ``EncoderDecoderCache`` of two ``DynamicCache`` s inside):

* ``encoder``: ``input_ids``, ``attention_mask`` ``int64 [batch, source]`` (text), or ``input_features``
  ``float32 [batch, mels, frames]`` (speech; Whisper's frames are fixed at ``2 * max_source_positions``)
  -> ``encoder_hidden_states`` ``float32 [batch, source, d_model]``;
* ``prefill``: ``decoder_input_ids`` ``int64 [batch, 1]`` (the decoder start token), ``encoder_hidden_states``
  and (text) the encoder's ``attention_mask`` -> ``logits`` ``float32 [batch, vocab]``, ``cache`` (the decoder's
  self-attention ``(key, value)`` per layer, ``[batch, heads, 1, head_dim]``) and ``cross_cache`` (the
  cross-attention ``(key, value)`` per layer, ``[batch, heads, source, head_dim]``);
* ``decode``: one token, ``encoder_hidden_states``, ``attention_mask`` (text), the ``cache`` of ``past`` positions
  and the ``cross_cache`` -> ``logits`` and the ``cache`` of ``past + 1`` positions.

Why three programs and not two: the encoder runs once per input and its output is all the decoder steps share.
The cross-attention keys and values are computed from it once, by the prefill, and read from the cache by every
decode step; which of the two a layer does is Python control flow (``EncoderDecoderCache.is_updated``, set when
the cross cache holds positions), so a program can do only one of them. A decode step with an empty self cache
(``past = 0``) would be that same branch problem, and a zero-sized example dim is one ``torch.export``
specializes, so the first step is its own program. The decode step takes ``encoder_hidden_states`` although it
reads only their shape (the models pick the cross-attention path by ``encoder_hidden_states is not None``).

Dims: ``batch`` in ``[1, max_batch]``; ``source`` (text) in ``[1, max_source_len]`` where ``max_source_len`` is
the model's ``max_position_embeddings`` (BART), else 512 (T5's relative positions have no limit; 512 is its
training length); ``past`` in ``[1, max_cache_len - 1]`` where ``max_cache_len`` bounds the decoder sequence
(start token(s) and new tokens; for Whisper at most ``max_target_positions``). ExecuTorch plans memory for
these bounds.

:func:`prepare_seq2seq` (under the one greedy loop, :mod:`hfexport_dynamo.tasks.decoding`) matches eager ``model.generate(..., do_sample=False)``:

* T5, BART: ``GenerationMixin.generate``: the decoder starts from ``decoder_start_token_id`` (else
  ``bos_token_id``); the result is ``[batch, 1 + new]`` decoder ids, the start token first, a finished row
  padded with ``pad_token_id``; the logits processors are transformers' own (``forced_eos_token_id``,
  ``min_new_tokens``, ``repetition_penalty``, ``encoder_repetition_penalty`` ... with the encoder's
  ``input_ids``).
* Whisper: ``WhisperGenerationMixin.generate`` for short-form audio without timestamps. The init tokens are the
  decoder start token, then the language (``language=`` or the generation config's; detected from the prefill's
  logits over ``lang_to_id`` when the config has ``lang_to_id`` and no language, as ``detect_language`` does),
  the task (``task=``, ``transcribe`` by default when a language is set) and ``no_timestamps_token_id`` when the
  config has one; or the legacy ``forced_decoder_ids``. The prefill consumes the start token and the other
  init tokens go through decode steps one at a time (eager runs them in one forward; same attention, so the
  logits differ at most by float rounding). ``suppress_tokens`` and ``begin_suppress_tokens`` (from the first
  generated position) are applied after the config's other processors, in Whisper's order. Like Whisper's
  generate, the result holds only the generated tokens, per row without trailing ``pad_token_id`` s (counting
  every pad id of the row, as transformers does) and without a final EOS, right-padded with ``pad_token_id`` to
  the longest row: ``[batch, new']``, not ``[batch, 1 + new]``. Refused: ``return_timestamps=True``,
  long-form audio (more frames than the program's), ``no_speech_threshold``, and a temperature fallback (all
  need several generate passes or timestamps).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hfexport.plugin import InvalidInputError

from .decoding import GenerationStats, GreedyRun, check_bounds, check_prompt, input_names, token_id_list
from .names import DECODE, ENCODER, PREFILL, SPEECH_RECOGNITION, TEXT2TEXT_GENERATION
from .planning import SEQ2SEQ_DEFAULT_MAX_CACHE_LEN, check_generative, checked_bounds, generation_manifest

__all__ = ["EncoderDecoderPrograms", "Seq2SeqDecoderStep", "Seq2SeqEncoderStep", "SpeechEncoderStep", "plan_seq2seq",
           "prepare_seq2seq"]

DEFAULT_MAX_SOURCE_LEN = 512
_TRACE_SOURCE, _TRACE_PAST = 6, 3  # not 0 or 1: torch.export specializes those sizes


class Seq2SeqEncoderStep(torch.nn.Module):
    """A text encoder's forward as a program: ``input_ids``, ``attention_mask`` -> ``encoder_hidden_states``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.encoder = model.get_encoder()
        self.config = model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return {"encoder_hidden_states": out.last_hidden_state}


class SpeechEncoderStep(torch.nn.Module):
    """A speech encoder's forward as a program: ``input_features`` -> ``encoder_hidden_states``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.encoder = model.get_encoder()
        self.config = model.config

    def forward(self, input_features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"encoder_hidden_states": self.encoder(input_features=input_features, return_dict=True).last_hidden_state}


class Seq2SeqDecoderStep(torch.nn.Module):
    """One decoder forward of an encoder-decoder with its caches as tensors: what ``prefill`` and ``decode`` export.

    Args:
        model: a ``...ForConditionalGeneration`` (T5, BART, Whisper).

    Forward:
        decoder_input_ids: ``int64 [batch, seq]``.
        encoder_hidden_states: ``float [batch, source, d_model]``.
        attention_mask: the encoder's ``int64 [batch, source]``, 0 at padding (text models only).
        cache: ``((key, value), ...)`` per decoder layer, ``[batch, heads, past, head_dim]``; ``None`` for a prefill.
        cross_cache: ``((key, value), ...)`` per decoder layer, ``[batch, heads, source, head_dim]``; ``None`` for
            a prefill, which computes it.

    Returns:
        ``{"logits": float [batch, vocab] (last position), "cache": ... with past + seq}``, and ``"cross_cache"``
        for a prefill.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, decoder_input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None,
                cross_cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None) -> dict[str, Any]:
        from transformers import DynamicCache, EncoderDecoderCache

        kv = EncoderDecoderCache(DynamicCache(cache), DynamicCache(cross_cache))
        extra = {} if attention_mask is None else {"attention_mask": attention_mask}
        out = self.model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=decoder_input_ids, cache=kv,
                         use_cache=True, return_dict=True, **extra)
        result = {"logits": out.logits[:, -1, :],
                  "cache": tuple((layer.keys, layer.values) for layer in out.cache.self_attention_cache.layers)}
        if cross_cache is None:
            result["cross_cache"] = tuple((layer.keys, layer.values)
                                          for layer in out.cache.cross_attention_cache.layers)
        return result


# ── planning ────────────────────────────────────────────────────────────────────────────────────────────
def _is_speech(model: Any) -> bool:
    return getattr(model, "main_input_name", "input_ids") == "input_features"


def _decoder_start(model: Any) -> int:
    config = getattr(model, "generation_config", None) or model.config
    start = getattr(config, "decoder_start_token_id", None)
    start = start if start is not None else getattr(config, "bos_token_id", None)
    if start is None:
        start = getattr(model.config, "decoder_start_token_id", None)
    if not isinstance(start, int):
        raise InvalidInputError(f"{type(model).__name__} has no int decoder_start_token_id (nor bos_token_id) in "
                                f"its generation config, got {start!r}: set model.generation_config."
                                "decoder_start_token_id to the id its decoder starts from")
    return start


def _feature_shape(model: Any) -> tuple[int, int]:
    """Whisper's ``[mels, frames]``: frames are fixed by the encoder (its convolutions' strides times
    ``max_source_positions``)."""
    encoder = model.get_encoder()
    stride = encoder.conv1.stride[0] * encoder.conv2.stride[0]
    return model.config.num_mel_bins, stride * model.config.max_source_positions


def _source_bound(model: Any) -> int:
    positions = getattr(model.config, "max_position_embeddings", None)
    return int(positions) if positions else DEFAULT_MAX_SOURCE_LEN


def _source(model: Any, task: str, inputs: Mapping[str, Any] | None, max_batch: int) -> dict[str, torch.Tensor]:
    """The encoder's example inputs (the user's, or seeded ones of batch 2)."""
    speech = _is_speech(model)
    name = "input_features" if speech else "input_ids"
    if inputs is not None:
        if not isinstance(inputs, Mapping) or not isinstance(inputs.get(name), torch.Tensor):
            shape = "FloatTensor[batch, mels, frames]" if speech else "LongTensor[batch, source]"
            extra = "" if speech else ", 'attention_mask': ..."
            raise InvalidInputError(f"an export of {type(model).__name__} for task {task!r} takes inputs="
                                    f"{{{name!r}: {shape}{extra}}} (the encoder input to trace with), or none")
        given = ({"input_features": inputs["input_features"].float()} if speech else
                 {"input_ids": inputs["input_ids"],
                  "attention_mask": inputs.get("attention_mask", torch.ones_like(inputs["input_ids"]))})
        batch = given[name].shape[0]
        if batch > max_batch or (not speech and given[name].shape[-1] < 2):
            raise InvalidInputError(f"the example {name} of shape {list(given[name].shape)} cannot be traced: "
                                    f"pass a batch of at most max_batch={max_batch}"
                                    f"{'' if speech else ' and at least 2 tokens'}, or no inputs")
        if batch == 1 and max_batch > 1:  # torch.export specializes a dim of size 1: trace a batch of 2
            given = {k: v.repeat(2, *[1] * (v.dim() - 1)) for k, v in given.items()}
        return given
    generator = torch.Generator().manual_seed(0)
    batch = min(2, max_batch)
    if speech:
        return {"input_features": torch.randn(batch, *_feature_shape(model), generator=generator)}
    vocab = model.config.vocab_size
    ids = torch.randint(3 if vocab > 3 else 0, vocab, (batch, _TRACE_SOURCE), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, -2:] = 0  # a padded row, so that the mask is traced as data
    return {"input_ids": ids, "attention_mask": mask}


def plan_seq2seq(model: Any, task: str, inputs: Mapping[str, Any] | None = None, *, max_cache_len: int | None = None,
                 max_batch: int | None = None) -> Any:
    """The ``encoder``, ``prefill`` and ``decode`` components of an encoder-decoder (see the module docstring).

    Args:
        model: an encoder-decoder with a language-modeling head (``T5ForConditionalGeneration``,
            ``BartForConditionalGeneration``, ``WhisperForConditionalGeneration``).
        task: ``"text2text-generation"`` or ``"automatic-speech-recognition"``.
        inputs: the encoder's example inputs (``input_ids`` and ``attention_mask``, or ``input_features``);
            default: seeded ones of batch 2.
        max_cache_len: the most positions the decoder sequence may hold, start token(s) and new tokens (default:
            the model's positions, capped at 256).
        max_batch: the largest batch (default 1).

    Raises:
        ValueError: bounds the model cannot take (says which).
        hfexport.InvalidInputError: the model is no encoder-decoder, the task does not fit the model's input
            (speech vs text), no decoder start token, or example inputs of the wrong kind.
    """
    from torch.export import Dim

    from hfexport.plugin import ComponentPlan, TaskPlan

    check_generative(model, task)
    max_cache_len, max_batch = checked_bounds(model, max_cache_len, max_batch,
                                              default_cap=SEQ2SEQ_DEFAULT_MAX_CACHE_LEN)
    speech = _is_speech(model)
    if speech != (task == SPEECH_RECOGNITION):
        want = SPEECH_RECOGNITION if speech else TEXT2TEXT_GENERATION
        raise InvalidInputError(f"{type(model).__name__} cannot be exported for task {task!r}: its encoder takes "
                                f"{'input_features (speech)' if speech else 'input_ids (text)'}; export it with "
                                f"task={want!r}")
    start = _decoder_start(model)
    source_inputs = _source(model, task, inputs, max_batch)
    batch_size = next(iter(source_inputs.values())).shape[0]
    encoder = SpeechEncoderStep(model) if speech else Seq2SeqEncoderStep(model)
    step = Seq2SeqDecoderStep(model)
    with torch.no_grad():
        hidden = encoder(**source_inputs)["encoder_hidden_states"]
        mask = {} if speech else {"attention_mask": source_inputs["attention_mask"]}
        first = torch.full((batch_size, 1), start, dtype=torch.long)
        prefill_inputs = {"decoder_input_ids": first, "encoder_hidden_states": hidden, **mask}
        cross = step(**prefill_inputs)["cross_cache"]
        # a self cache of _TRACE_PAST positions (a past of 1 would be specialized): start + random tokens
        vocab = model.config.vocab_size
        prior = torch.randint(3 if vocab > 3 else 0, vocab, (batch_size, _TRACE_PAST - 1),
                              generator=torch.Generator().manual_seed(1))
        cache = step(decoder_input_ids=torch.cat([first, prior], -1), encoder_hidden_states=hidden, **mask)["cache"]
    decode_inputs = {"decoder_input_ids": prior[:, -1:], "encoder_hidden_states": hidden, **mask, "cache": cache,
                     "cross_cache": cross}

    batch = Dim("batch", min=1, max=max_batch) if max_batch > 1 else None  # None: static (a batch of 1)
    past = Dim("past", min=1, max=max_cache_len - 1)
    if speech:
        source_bound = hidden.shape[1]
        encoder_shapes = {"input_features": {0: batch}}
        hidden_shape = {0: batch}
        kv_cross = {0: batch}
    else:
        source_bound = _source_bound(model)
        source = Dim("source", min=1, max=source_bound)
        encoder_shapes = {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}}
        hidden_shape = {0: batch, 1: source}
        kv_cross = {0: batch, 2: source}
    common = {"encoder_hidden_states": hidden_shape, **({} if speech else {"attention_mask": {0: batch, 1: source}})}
    prefill_shapes = {"decoder_input_ids": {0: batch}, **common}
    decode_shapes = {"decoder_input_ids": {0: batch}, **common,
                     "cache": tuple(({0: batch, 2: past}, {0: batch, 2: past}) for _ in cache),
                     "cross_cache": tuple((kv_cross, kv_cross) for _ in cross)}
    section = generation_manifest(model, max_cache_len, max_batch, len(cache))
    section.update(decoder_start_token_id=start, encoder_input="input_features" if speech else "input_ids",
                   max_source_len=source_bound)
    if speech:
        section["input_features_shape"] = list(_feature_shape(model))
        section["max_target_positions"] = model.config.max_target_positions
    return TaskPlan(task, [ComponentPlan(ENCODER, encoder, source_inputs, encoder_shapes),
                           ComponentPlan(PREFILL, step, prefill_inputs, prefill_shapes),
                           ComponentPlan(DECODE, step, decode_inputs, decode_shapes)],
                    manifest={"generation": section}, model=model)


# ── greedy decoding ─────────────────────────────────────────────────────────────────────────────────────
def _check_features(features: Any, decoder_len: int, config: Any, section: Mapping[str, Any]) -> torch.Tensor:
    mels, frames = section["input_features_shape"]
    if not isinstance(features, torch.Tensor) or not features.is_floating_point() or features.dim() != 3:
        raise TypeError(f"input_features must be a float tensor [batch, {mels}, {frames}] (log-mel features), got "
                        f"{getattr(features, 'dtype', type(features).__name__)} of shape "
                        f"{list(getattr(features, 'shape', []))}")
    if tuple(features.shape[1:]) != (mels, frames):
        more = " (long-form audio needs several 30 s windows and timestamps, which exported generation does not " \
               "do: split it)" if features.shape[1] == mels and features.shape[2] > frames else ""
        raise ValueError(f"input_features has shape {list(features.shape)}; this export takes [batch, {mels}, "
                         f"{frames}]{more}")
    check_bounds(features.shape[0], decoder_len, config, section, "an init sequence")
    return features.float()


def _whisper_init(config: Any) -> tuple[list[int | None], bool]:
    """Whisper's init tokens (``WhisperGenerationMixin._retrieve_init_tokens``) as a list whose second entry is
    ``None`` when the language is to be detected; and whether it is."""
    unsupported = [name for name, on in (
        ("return_timestamps=True", getattr(config, "return_timestamps", None)),
        ("no_speech_threshold", getattr(config, "no_speech_threshold", None) is not None),
        ("prompt_ids", getattr(config, "prompt_ids", None) is not None),
        ("a temperature fallback (a list of temperatures)", isinstance(getattr(config, "temperature", None),
                                                                        list | tuple))) if on]
    if unsupported:
        raise ValueError(f"exported Whisper generation does short-form transcription without timestamps: "
                         f"{', '.join(unsupported)} is not supported")
    language, task = getattr(config, "language", None), getattr(config, "task", None)
    lang_to_id = getattr(config, "lang_to_id", None) or {}
    task_to_id = getattr(config, "task_to_id", None) or {}
    if getattr(config, "is_multilingual", None) is False and (language or task):
        raise ValueError("cannot pass language or task to an English-only Whisper (is_multilingual=False)")
    tokens: list[int | None] = [config.decoder_start_token_id]
    if language is None and task is None:
        forced = getattr(config, "forced_decoder_ids", None) or []
        position = 1
        for index, token in forced:
            if index != position:
                raise ValueError(f"forced_decoder_ids {forced} do not follow Whisper's prompt pattern (an entry for "
                                 "every index from 1)")
            tokens.append(token)
            position += 1
    if language is not None:
        if not isinstance(language, str):
            raise ValueError(f"pass one language (a string) for the whole batch, got {language!r}")
        key = language if language in lang_to_id else f"<|{language.lower()}|>"
        if key not in lang_to_id:
            from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

            key = f"<|{TO_LANGUAGE_CODE.get(language.lower(), language.lower())}|>"
        if key not in lang_to_id:
            raise ValueError(f"language {language!r} is not in the generation config's lang_to_id "
                             f"({', '.join(sorted(lang_to_id)) or 'empty'})")
        tokens[1:2] = [lang_to_id[key]]
    detect = bool(lang_to_id) and language is None and (len(tokens) <= 1 or tokens[1] is None)
    if detect and len(tokens) == 1:
        tokens.append(None)
    if task is not None:
        if task not in task_to_id:
            raise ValueError(f"task {task!r} is not in the generation config's task_to_id ({', '.join(task_to_id)})")
        tokens.append(task_to_id[task])  # forced_decoder_ids (which might hold one) are ignored with a task
    elif language is not None and task_to_id and not any(t in task_to_id.values() for t in tokens):
        tokens.append(task_to_id["transcribe"])
    no_timestamps = getattr(config, "no_timestamps_token_id", None)
    if no_timestamps is not None and tokens[-1] != no_timestamps:
        tokens.append(no_timestamps)
    return [t for i, t in enumerate(tokens) if t is not None or (detect and i == 1)], detect


def _whisper_processors(config: Any, begin_index: int) -> list[Any]:
    """Whisper's own processors (``_retrieve_logit_processors``), which its generate puts after the config's."""
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    processors = []
    if config.begin_suppress_tokens is not None:
        processors.append(SuppressTokensAtBeginLogitsProcessor(config.begin_suppress_tokens, begin_index=begin_index))
    if config.suppress_tokens is not None:
        processors.append(SuppressTokensLogitsProcessor(config.suppress_tokens))
    return processors


def _whisper_result(sequences: torch.Tensor, start: int, config: Any) -> torch.Tensor:
    """What ``WhisperGenerationMixin.generate`` returns from ``GenerationMixin.generate``'s sequences: the new
    tokens, without trailing padding (it counts every pad id of the row) and a final EOS, right-padded."""
    pad, eos = config.pad_token_id, token_id_list(config.eos_token_id)
    rows = []
    for row in sequences[:, start:]:
        if len(row) and int(row[-1]) == pad:
            count = int((row == pad).sum()) - (1 if pad in eos else 0)
            row = row[:len(row) - count] if count else row
        if len(row) and eos and int(row[-1]) == eos[0]:
            row = row[:-1]
        rows.append(row)
    longest = max(len(r) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, longest - len(r)), value=pad) for r in rows])


def prepare_seq2seq(exported: Any, section: Mapping[str, Any], config: Any, input_ids: Any, attention_mask: Any,
                    media: Mapping[str, Any]) -> GreedyRun:
    """The encoder-decoders' part of :func:`hfexport_dynamo.tasks.decoding.generate`: the encoder's input checked
    and encoded (the ``encoder`` program, once), then the ``prefill`` and ``decode`` programs under the greedy loop.

    Args:
        exported: the artifact (``task`` ``"text2text-generation"`` or ``"automatic-speech-recognition"``).
        section: the manifest's ``generation`` section.
        config: the ``GenerationConfig`` (stored, with the caller's options applied; greedy, ``max_new_tokens``).
        input_ids: the encoder's ``int64 [batch, source]`` (right- or left-padded), or Whisper's
            ``input_features`` ``float [batch, mels, frames]``.
        attention_mask: ``int64 [batch, source]``, 0 at padding (default: ones); ignored for speech, as
            Whisper's generate ignores it for short-form audio.
        media: none (an encoder-decoder's manifest names no media inputs).

    Returns:
        The :class:`~hfexport_dynamo.tasks.decoding.GreedyRun` from the decoder start token; Whisper's init tokens
        after it are forced (the language detected from the prefill's logits where none is given), and its result
        is shaped as ``WhisperForConditionalGeneration.generate``'s (see the module docstring). T5, BART: ``int64
        [batch, 1 + new]`` decoder ids as ``model.generate`` returns them.

    Raises:
        TypeError: ids that are not an integer ``[batch, source]`` tensor, features that are not a float
            ``[batch, mels, frames]`` tensor.
        ValueError: a batch beyond ``max_batch``, a source beyond ``max_source_len``, start tokens plus
            ``max_new_tokens`` beyond ``max_cache_len``, ids outside the vocabulary, Whisper options exported
            generation does not do (each says which), before any program runs.
    """
    speech = section.get("encoder_input") == "input_features"
    config = copy.deepcopy(config)
    start_token = next(t for t in (config.decoder_start_token_id, config.bos_token_id,
                                    section["decoder_start_token_id"]) if t is not None)
    if not isinstance(start_token, int) or not 0 <= start_token < section["vocab_size"]:
        raise ValueError(f"decoder_start_token_id must be one id in the vocabulary [0, {section['vocab_size']}), "
                         f"got {start_token!r}")
    config.decoder_start_token_id = start_token
    if speech:
        init, detect = _whisper_init(config)
        features = _check_features(input_ids, len(init), config, section)
        feed = {"input_features": features}
        batch, encoder_ids, mask = features.shape[0], None, None
    else:
        init, detect = [start_token], False
        input_ids, mask = check_prompt(input_ids, attention_mask, config, section, "input_ids", decoder_len=1)
        feed = {"input_ids": input_ids, "attention_mask": mask}
        batch, encoder_ids = input_ids.shape[0], input_ids
    eos = token_id_list(config.eos_token_id)
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None)
    whisper = []
    if speech:
        whisper = _whisper_processors(config, len(init))
        config.suppress_tokens = config.begin_suppress_tokens = None  # Whisper's generate applies them itself

    start = time.perf_counter()
    hidden = exported.run(ENCODER, **feed)["encoder_hidden_states"]
    encoder_s = time.perf_counter() - start
    sequences = torch.full((batch, 1), init[0], dtype=torch.long)
    programs = EncoderDecoderPrograms(exported, sequences, {"encoder_hidden_states": hidden, "attention_mask": mask})

    def finish(sequences: torch.Tensor, stats: GenerationStats) -> torch.Tensor:
        if detect:
            stats["language_ids"] = sequences[:, 1].tolist()
        return _whisper_result(sequences, len(init), config) if speech else sequences

    return GreedyRun(programs, sequences, config, encoder_ids=encoder_ids, processors=whisper,
                     forced=[_forced(token, batch, config) for token in init[1:]], stats={"encoder_s": encoder_s},
                     finish=finish)


def _forced(token: int | None, batch: int, config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """One of Whisper's forced init tokens (language, task, ...) for every row; ``None``: the language, detected
    from the logits over ``lang_to_id``, as ``detect_language`` does."""
    if token is None:
        lang_ids = torch.tensor(sorted(set(config.lang_to_id.values())))
        return lambda logits: lang_ids[logits.float()[:, lang_ids].argmax(-1)]
    return lambda logits: torch.full((batch,), token, dtype=torch.long)


class EncoderDecoderPrograms:
    """The ``prefill`` and ``decode`` programs under the greedy loop
    (:class:`~hfexport_dynamo.tasks.decoding.TaskPrograms`): one prefill call on the decoder start token, which
    computes the cross-attention cache from ``encoder_hidden_states``; then decode steps, each taking the self
    cache the last call returned and the cross cache."""

    def __init__(self, exported: Any, start_ids: torch.Tensor, shared: Mapping[str, Any]):
        self.exported, self.start_ids, self.shared = exported, start_ids, dict(shared)
        self.prefill_names, self.decode_names = input_names(exported, PREFILL), input_names(exported, DECODE)
        self.prefill_spans = [slice(0, start_ids.shape[1])]
        self.cache: Any = None
        self.cross_cache: Any = None

    def running(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def prefill(self, span: slice) -> torch.Tensor:
        feed = {"decoder_input_ids": self.start_ids[:, span], **self.shared}
        out = self.exported.run(PREFILL, **{k: v for k, v in feed.items() if k in self.prefill_names})
        self.cache, self.cross_cache = out["cache"], out["cross_cache"]
        return out["logits"]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        feed = {"decoder_input_ids": tokens[:, None], **self.shared, "cache": self.cache,
                "cross_cache": self.cross_cache}
        out = self.exported.run(DECODE, **{k: v for k, v in feed.items() if k in self.decode_names})
        self.cache = out["cache"]
        return out["logits"]
