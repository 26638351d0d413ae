"""The one greedy decoding loop of every generative task (decoders, encoder-decoders, image- and audio-text
models), over an artifact's exported programs on its backend's runtime, and what it shares with transformers'
greedy ``generate``: the generation config merged with a call's options, transformers' own logits processors and
stopping criteria, the argmax, the padding of the rows that finished, and the checks of a prompt against the
export's bounds.

:func:`generate` merges the options into the stored generation config, asks the task's ``prepare`` (the task's
module: :func:`hfexport_dynamo.tasks.causal_lm.prepare_decoder`, :func:`~hfexport_dynamo.tasks.seq2seq.
prepare_seq2seq`, :func:`~hfexport_dynamo.tasks.image_prompt.prepare_media`) for a :class:`GreedyRun`, and runs
:func:`greedy` on it. What differs between tasks is data there: the ids the loop starts from, the programs that take
the tokens and carry the cache (:class:`TaskPrograms`: how the prompt is prefilled, one call or chunks, and what a
decode step feeds), the tokens the task forces after the prefill (Whisper's language and task), its own logits
processors, what it measured before the loop (encoding) and how the result is shaped from the loop's sequences.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

__all__ = ["GenerationStats", "GreedyRun", "TaskPrograms", "check_bounds", "check_prompt", "check_section_bounds",
           "generate", "greedy",
           "input_names", "logits_processors", "merged_generation_config", "next_greedy", "stopping_criteria",
           "token_id_list"]

_STORED: Any = type("_Stored", (), {"__repr__": lambda self: "<the generation config's>"})()  # eos_token_id left out
_SPEECH_OPTIONS = {"language", "task", "is_multilingual", "return_timestamps"}


class GenerationStats(dict):
    """Timings of the last :func:`generate` call: ``prefill_s``, ``decode_s``, ``new_tokens`` (per row),
    ``decode_steps``, ``decode_tokens_per_s`` (new tokens of the whole batch per second of decode),
    ``decode_step_s`` (the seconds of each decode step, in order: a decoder's step ``k`` writes cache position
    ``prompt + k``), and the task's own: ``encoder_s`` (encoder-decoders), ``encode_s`` (image- and audio-text),
    ``language_ids`` (Whisper, a detected language)."""


class TaskPrograms(Protocol):
    """How a task's programs take the tokens and carry the cache between the calls of :func:`greedy`.

    Attributes:
        prefill_spans: the prefill calls, each over these positions of the prompt (a decoder's chunks of
            ``prefill_chunk``; an encoder-decoder's one call over its start tokens).
    """

    prefill_spans: Sequence[slice]

    def running(self) -> contextlib.AbstractContextManager[Any]:
        """The context of the prefill and decode calls (a runner that binds its inputs binds them once)."""
        ...

    def prefill(self, span: slice) -> torch.Tensor:
        """Run the prefill over the prompt's positions ``span``; the last position's logits ``[rows, vocab]``."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run one decode step on ``tokens`` ``int64 [rows]`` (the next position of each row); its logits."""
        ...


@dataclass
class GreedyRun:
    """One :func:`generate` call's task-specific part, for :func:`greedy`.

    Attributes:
        programs: the task's programs (:class:`TaskPrograms`).
        sequences: ``int64 [rows, start]``, the ids the loop extends: a decoder's prompt, an encoder-decoder's
            decoder start token.
        config: the ``GenerationConfig`` (greedy, ``max_new_tokens`` set).
        encoder_ids: the encoder's ``input_ids`` (``encoder_repetition_penalty`` reads them), or None.
        attention_mask: a decoder's prompt mask ``[rows, start]`` (the repetition penalty skips its left padding).
        processors: the task's logits processors, after the config's (Whisper's suppressions).
        forced: per decode step after the prefill, the tokens the task forces from the last logits, before the
            greedy ones (Whisper's language, detected from the logits or given, and its task tokens); they are
            neither processed nor counted in ``new_tokens``.
        stats: what the task measured before the loop (``encode_s``, ``encoder_s``).
        finish: ``(sequences, stats) -> result``: the result from the loop's sequences (default: them).
    """

    programs: TaskPrograms
    sequences: torch.Tensor
    config: Any
    encoder_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    processors: Sequence[Any] = ()
    forced: Sequence[Callable[[torch.Tensor], torch.Tensor]] = ()
    stats: Mapping[str, Any] = field(default_factory=dict)
    finish: Callable[[torch.Tensor, GenerationStats], torch.Tensor] | None = None


Prepare = Callable[[Any, Mapping[str, Any], Any, Any, Any, dict[str, Any]], GreedyRun]


def generate(exported: Any, prepare: Prepare, input_ids: Any, attention_mask: Any = None, *,
             max_new_tokens: int | None = None, eos_token_id: Any = _STORED, pad_token_id: int | None = None,
             **generation_options: Any) -> torch.Tensor:
    """Greedy decoding over an artifact's exported programs, on its backend's runtime.

    Matches ``model.generate(input_ids, attention_mask=..., do_sample=False, max_new_tokens=...)`` token for
    token: the stored generation config with these arguments applied, transformers' logits processors, a row
    that produced EOS continues with ``pad_token_id`` and generation stops when every row has.

    Args:
        exported: an :class:`~hfexport.ExportedModel` exported with a generative task.
        prepare: the task's part, ``prepare(exported, section, config, input_ids, attention_mask, media)`` ->
            :class:`GreedyRun` (it checks the prompt before any program runs).
        input_ids: ``int64 [batch, prompt]``, left-padded (decoders); the encoder's input for an encoder-decoder
            (``input_features`` ``float [batch, mels, frames]`` for speech).
        attention_mask: ``int64 [batch, prompt]``, 0 at padding (default: ones).
        max_new_tokens: the number of tokens to generate (required).
        eos_token_id: the id(s) that end a row (default: the generation config's; ``None`` never stops early).
        pad_token_id: the id written after a row's EOS (default: the generation config's, else the first EOS).
        **generation_options: other ``GenerationConfig`` fields (``min_new_tokens``, ``repetition_penalty``); the
            media inputs the manifest names (``pixel_values``, ``input_features`` of an audio-text export, ...).

    Returns:
        ``int64 [batch, prompt + new]`` (decoders) or ``[batch, 1 + new]`` decoder ids (encoder-decoders; Whisper's
        as its ``generate``: :mod:`hfexport_dynamo.tasks.seq2seq`). The timings are in
        ``exported.generation_stats`` (:class:`GenerationStats`).

    Raises:
        ValueError: no ``max_new_tokens``, sampling or beams asked for, prompt plus new tokens beyond
            ``max_cache_len``, a batch beyond ``max_batch``, or an EOS or pad id outside the vocabulary (each
            names the bound), before any program runs.
        TypeError: ``input_ids`` is not an integer tensor of rank 2, or an option is no ``GenerationConfig`` field.
    """
    section = exported.manifest["generation"]
    check_section_bounds(exported, section)  # before any cache, mask or prompt buffer is made from it
    options = dict(generation_options)  # an option passed as None sets it to None, as in model.generate
    if max_new_tokens is not None:
        options["max_new_tokens"] = max_new_tokens
    if pad_token_id is not None:
        options["pad_token_id"] = pad_token_id
    if eos_token_id is not _STORED:
        options["eos_token_id"] = eos_token_id
    media_inputs = next((section[kind]["inputs"] for kind in ("audio", "vision") if kind in section), ())
    media = {name: options.pop(name) for name in list(options) if name in media_inputs}  # not config fields
    config = merged_generation_config(section, options)
    run = prepare(exported, section, config, input_ids, attention_mask, media)
    sequences, stats = greedy(run, section)
    exported.generation_stats = stats
    return run.finish(sequences, stats) if run.finish is not None else sequences


# The most bytes of caches and masks a manifest's ``generation`` section may make ``generate`` allocate: 64 MiB
# beyond the artifact's own hashed bytes, at most 8 GiB (a 0.5-8 B model's cache of 4,096 positions is far under its
# weights; 512 MiB let a 0.5 MB artifact make generate allocate +515 MiB: issue 43's bounds probe). As
# ``hfexport._stored.built_inputs_budget``.
_SECTION_BASE_BYTES = 64 * 2**20
_SECTION_MAX_BYTES = 8 * 2**30


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _declared_dim(entry: Mapping[str, Any] | None, dim: int) -> tuple[int | None, bool]:
    """``(bound, static)`` of dim ``dim`` of a manifest input entry: its static size, or its dynamic max."""
    shape = entry.get("shape") if isinstance(entry, Mapping) else None
    if not isinstance(shape, list) or len(shape) <= dim:
        return None, False
    spec = shape[dim]
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec, True
    if isinstance(spec, str) and spec.isdigit():
        return int(spec), True
    info = (entry.get("dynamic_dims") or {}).get(str(dim)) if isinstance(entry.get("dynamic_dims"), dict) else None
    high = info.get("max") if isinstance(info, dict) else None
    return (high if _positive_int(high) else None), False


def check_section_bounds(exported: Any, section: Mapping[str, Any]) -> None:
    """Check the sizes the manifest's ``generation`` section gives (``max_batch``, ``max_cache_len``,
    ``prefill_chunk``, the cache's ``row_shapes`` and ``dtype``) before :func:`generate` allocates anything from
    them: each a positive int of the right form, ``max_batch`` and ``max_cache_len`` within the ``decoder``
    program's own declared bounds (its ``attention_mask`` input ``[batch, max_cache_len]``), as many cache rows
    as the program's ``cache`` input has leaves, and the cache plus the mask within a memory budget (64 MiB
    beyond the artifact's hashed bytes, at most 8 GiB).

    Raises:
        ValueError: the value and the bound it breaks (the artifact is damaged or crafted).
    """
    from hfexport.trust import torch_dtype

    def refuse(what: str) -> ValueError:
        return ValueError(f"this artifact's export.json generation section {what}: the artifact is damaged or "
                          "crafted (re-export it)")

    if not isinstance(section, Mapping):
        raise refuse("is not an object")
    for key in ("max_batch", "max_cache_len", "vocab_size"):
        if not _positive_int(section.get(key)):
            raise refuse(f"has {key}={section.get(key)!r}, not a positive integer")
    max_batch, max_cache_len = section["max_batch"], section["max_cache_len"]
    if "prefill_chunk" in section and not (_positive_int(section["prefill_chunk"])
                                           and section["prefill_chunk"] <= max_cache_len):
        raise refuse(f"has prefill_chunk={section['prefill_chunk']!r}, not an int from 1 to max_cache_len="
                     f"{max_cache_len}")
    if "max_source_len" in section and not _positive_int(section["max_source_len"]):
        raise refuse(f"has max_source_len={section['max_source_len']!r}, not a positive integer")
    components = exported.manifest.get("components") or {}
    decoder = components.get("decoder") if isinstance(components, Mapping) else None
    entries = decoder.get("inputs") if isinstance(decoder, Mapping) else None
    by_name = {e.get("name"): e for e in entries or [] if isinstance(e, Mapping)}
    mask = by_name.get("attention_mask")
    batch_bound, _ = _declared_dim(mask, 0)
    length_bound, _ = _declared_dim(mask, 1)
    if batch_bound is not None and max_batch > batch_bound:
        raise refuse(f"has max_batch={max_batch:,}, beyond the decoder program's declared batch bound of "
                     f"{batch_bound:,} (its attention_mask input)")
    if length_bound is not None and max_cache_len > length_bound:
        raise refuse(f"has max_cache_len={max_cache_len:,}, beyond the decoder program's declared cache length of "
                     f"{length_bound:,} (its attention_mask input)")
    hashed = exported.manifest.get("files_sha256")
    artifact_bytes = sum(e["size"] for e in hashed.values() if isinstance(e, Mapping) and _positive_int(e.get("size"))) \
        if isinstance(hashed, Mapping) else 0
    budget = min(_SECTION_MAX_BYTES, _SECTION_BASE_BYTES + artifact_bytes)
    total = 2 * max_batch * max_cache_len * 8  # the mask over the cache and the prompt's own, int64
    cache = section.get("cache")
    if decoder is not None and not isinstance(cache, Mapping):
        raise refuse("has no cache object")
    if isinstance(cache, Mapping):
        rows = cache.get("row_shapes")
        if not isinstance(rows, list) or not all(
                isinstance(layer, list) and len(layer) == 2 and all(
                    isinstance(shape, list) and 1 <= len(shape) <= 3 and all(_positive_int(d) for d in shape)
                    for shape in layer) for layer in rows):  # a conv state's: [channels, kernel] and [1]
            raise refuse("has cache.row_shapes that are not, per layer, two shapes of one to three positive integers")
        dtype = torch_dtype(cache.get("dtype"))
        if dtype is None:
            raise refuse(f"has cache.dtype={cache.get('dtype')!r:.40}, not a torch dtype")
        leaves = by_name.get("cache", {}).get("leaves")
        # a growing cache carries one leaf for a layer of one conv state (cache.state_layers: {layer: "conv"})
        states = cache.get("state_layers") or {}
        single = sum(kind == "conv" for kind in states.values()) if cache.get("growing") and isinstance(
            states, Mapping) else 0
        if "cache" in by_name and leaves != 2 * len(rows) - single:
            raise refuse(f"has {len(rows):,} cache layers where the decoder program's cache input has {leaves!r} "
                         "leaves (two per layer, one per conv-state layer of a growing cache)")
        lengths = {d for layer in rows for shape in layer for d in shape if d == max_cache_len}
        if rows and not lengths:
            raise refuse(f"has cache.row_shapes without a dim of max_cache_len={max_cache_len:,}")
        for layer in rows:  # a static batch holds max_batch rows; a dynamic one at most that many
            for shape in layer:
                total += max_batch * math.prod(shape) * dtype.itemsize
    if total > budget:
        raise refuse(f"describes {total:,} bytes of cache and masks (max_batch={max_batch:,}, max_cache_len="
                     f"{max_cache_len:,}), over the {budget:,} bytes generate allocates for an artifact of "
                     f"{artifact_bytes:,} bytes")


def greedy(run: GreedyRun, section: Mapping[str, Any]) -> tuple[torch.Tensor, GenerationStats]:
    """The greedy loop (transformers' ``GenerationMixin._sample`` with ``do_sample=False``) over ``run.programs``:
    the prefill, in one call or several; the tokens the task forces; then per step the logits processors, the
    argmax, ``pad`` for the rows that finished, the stopping criteria (``max_new_tokens``, or every row at EOS) and
    a decode step on the new tokens.

    Returns:
        ``(sequences int64 [rows, start + forced + new], stats)``.
    """
    config, programs, sequences = run.config, run.programs, run.sequences
    rows, start_len = sequences.shape[0], sequences.shape[1] + len(run.forced)
    eos = token_id_list(config.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None)
    processors = logits_processors(config, section, start_len, run.encoder_ids, run.attention_mask)
    processors.extend(run.processors)
    criteria = stopping_criteria(start_len + config.max_new_tokens, eos)
    with programs.running():
        start = time.perf_counter()
        for span in programs.prefill_spans:
            logits = programs.prefill(span)
        prefill_s = time.perf_counter() - start
        unfinished, steps = torch.ones(rows, dtype=torch.bool), 0
        start = time.perf_counter()
        step_ends = [start]
        for force in run.forced:
            tokens = force(logits)
            sequences = torch.cat([sequences, tokens[:, None]], -1)
            logits = programs.step(tokens)
            steps += 1
            step_ends.append(time.perf_counter())
        while True:  # stopping_criteria ends it: max length, or every row at EOS
            sequences, tokens = next_greedy(sequences, logits, processors, criteria, unfinished, pad)
            if not bool(unfinished.any()):
                break
            logits = programs.step(tokens)
            steps += 1
            step_ends.append(time.perf_counter())
        decode_s = time.perf_counter() - start
    return sequences, GenerationStats(
        **run.stats, prefill_s=prefill_s, decode_s=decode_s, decode_steps=steps,
        new_tokens=sequences.shape[1] - start_len,
        decode_tokens_per_s=steps * rows / decode_s if decode_s > 0 and steps else float("nan"),
        decode_step_s=[b - a for a, b in zip(step_ends, step_ends[1:], strict=False)])


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
