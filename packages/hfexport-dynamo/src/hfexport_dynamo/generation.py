"""Generation: the programs a generative model runs (a prefill and a decode step, with the KV cache as program
inputs and outputs) and greedy decoding over them on any backend's runtime.

A decoder (``task="text-generation"``) is exported as two components of one :class:`CausalLMStep` wrapper:

* ``prefill``: ``input_ids``, ``attention_mask``, ``position_ids`` ``int64 [batch, prompt]`` -> ``logits``
  ``float32 [batch, vocab]`` (the last position's) and ``cache``, one ``(key, value)`` pair per layer, each
  ``[batch, kv_heads, prompt, head_dim]``;
* ``decode``: one new token (``input_ids``, ``position_ids`` ``[batch, 1]``), ``attention_mask`` ``[batch, past + 1]``
  and the ``cache`` of ``past`` positions -> ``logits`` and the cache of ``past + 1`` positions.

The cache crosses the program boundary as tensors and is a transformers ``DynamicCache`` inside (built from the
config, so sliding-window layers keep their type); the batch, prompt and past lengths are dynamic ``Dim`` s
bounded by ``max_batch`` and ``max_cache_len`` (ExecuTorch plans its memory for those bounds).

:func:`generate` is the greedy loop; transformers supplies its logits processors (``_get_logits_processor``
from the stored generation config: repetition penalty, suppressed tokens, minimum length ...) and its stopping
criteria (``MaxLengthCriteria``, ``EosTokenCriteria``), and rows that reached EOS are padded exactly as
``model.generate(do_sample=False)`` pads them.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

import torch

from hfexport.plugin import InvalidInputError

from ._decoding import (
    TASKS,
    TEXT_GENERATION,
    GenerationStats,
    check_prompt,
    generation_manifest,
    input_names,
    logits_processors,
    merged_generation_config,
    stopping_criteria,
    token_id_list,
)

__all__ = ["TASKS", "CausalLMStep", "GenerationStats", "generate", "plan_task"]


DEFAULT_MAX_CACHE_LEN = 256
DEFAULT_MAX_BATCH = 4
_STORED: Any = type("_Stored", (), {"__repr__": lambda self: "<the generation config's>"})()  # eos_token_id left out
_TRACE_BATCH, _TRACE_PROMPT = 2, 6  # not 0 or 1: torch.export specializes those sizes


class CausalLMStep(torch.nn.Module):
    """One forward of a decoder with its KV cache as tensors: the module ``prefill`` and ``decode`` export.

    Args:
        model: a ``PreTrainedModel`` with a language-modeling head (``...ForCausalLM``).

    Forward:
        input_ids: ``int64 [batch, seq]``.
        attention_mask: ``int64 [batch, past + seq]``, 0 at left padding.
        position_ids: ``int64 [batch, seq]`` (only when the model's forward takes them).
        cache: ``((key, value), ...)`` per layer, ``[batch, kv_heads, past, head_dim]``; ``None`` for a prefill.

    Returns:
        ``{"logits": float [batch, vocab] (last position), "cache": ((key, value), ...) with past + seq}``.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config  # the tracer writes config.json and reads the model's facts from it
        self.takes_position_ids = "position_ids" in inspect.signature(model.forward).parameters

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None) -> dict[str, Any]:
        from transformers import DynamicCache

        kv = DynamicCache(cache, config=self.model.config)
        extra = {"position_ids": position_ids} if self.takes_position_ids else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, cache=kv, use_cache=True,
                         logits_to_keep=1, **extra)
        if getattr(out, "cache", None) is None:  # e.g. BertLMHeadModel without config.is_decoder
            raise InvalidInputError(f"{type(self.model).__name__} returned no KV cache with use_cache=True, so "
                                    "it cannot generate step by step: load it as a decoder (config.is_decoder=True "
                                    "for BERT-like models) or export it without a task")
        return {"logits": out.logits[:, -1, :],
                "cache": tuple((layer.keys, layer.values) for layer in out.cache.layers)}


# ── planning ────────────────────────────────────────────────────────────────────────────────────────────
def _refuse(model: Any, task: str, why: str, instead: str) -> InvalidInputError:
    return InvalidInputError(f"{type(model).__name__} cannot be exported for task {task!r}: {why}; {instead}")


def _check_generative(model: Any, task: str) -> None:
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


def _bounds(model: Any, max_cache_len: int | None, max_batch: int | None) -> tuple[int, int]:
    config = model.config.get_text_config(decoder=True)
    positions = (getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
                 or getattr(config, "max_target_positions", None))  # Whisper's decoder
    if max_cache_len is None:
        max_cache_len = min(positions or DEFAULT_MAX_CACHE_LEN, DEFAULT_MAX_CACHE_LEN)
    max_batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
    for name, value, least in (("max_cache_len", max_cache_len, _TRACE_PROMPT + 2), ("max_batch", max_batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if positions and max_cache_len > positions:
        raise ValueError(f"max_cache_len={max_cache_len} exceeds the model's {positions} positions "
                         "(max_position_embeddings): lower it")
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    if window and ("sliding_attention" in layer_types or getattr(config, "use_sliding_window", True)) \
            and window < max_cache_len:
        raise ValueError(f"max_cache_len={max_cache_len} exceeds the sliding window ({window} tokens), past "
                         "which the cache rolls over: export with max_cache_len <= sliding_window")
    return max_cache_len, max_batch


def _prompt(model: Any, inputs: Mapping[str, Any] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill's example ``input_ids`` and ``attention_mask`` (the user's, or seeded ones from the config)."""
    if inputs is not None:
        if not isinstance(inputs, Mapping) or not isinstance(inputs.get("input_ids"), torch.Tensor):
            raise InvalidInputError("a text-generation export takes inputs={'input_ids': LongTensor[batch, prompt], "
                                    "'attention_mask': ...} (the prompt to trace with), or none")
        ids = inputs["input_ids"]
        return ids, inputs.get("attention_mask", torch.ones_like(ids))
    vocab = model.config.get_text_config(decoder=True).vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3 if vocab > 3 else 0, vocab, (_TRACE_BATCH, _TRACE_PROMPT), generator=generator)
    return ids, torch.ones_like(ids)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded prompt, as transformers' generate makes them (0 at padding)."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def plan_task(model: Any, task: str, inputs: Mapping[str, Any] | None = None, *, max_cache_len: int | None = None,
              max_batch: int | None = None) -> Any:
    """The components to export for ``task``: for ``"text-generation"``, ``prefill`` and ``decode`` of a
    :class:`CausalLMStep` (see the module docstring for their inputs, outputs and dynamic dims).

    Args:
        model: a Transformers model with a generation head.
        task: one of :data:`TASKS`.
        inputs: an example prompt (``input_ids``, ``attention_mask``); default: 2 x 6 seeded tokens.
        max_cache_len: the most positions a sequence may hold, prompt and new tokens (default:
            ``min(max_position_embeddings, 256)``); the upper bound of the prompt and past ``Dim`` s.
        max_batch: the largest batch (default 4).

    Raises:
        ValueError: an unknown task (lists them), or bounds the model cannot take (says which).
        hfexport.InvalidInputError: the model cannot generate (says why and what to load instead).
    """
    from hfexport.plugin import ComponentPlan, TaskPlan

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    _check_generative(model, task)
    if task != TEXT_GENERATION:
        from ._seq2seq import plan_seq2seq

        return plan_seq2seq(model, task, inputs, *_bounds(model, max_cache_len, max_batch))
    max_cache_len, max_batch = _bounds(model, max_cache_len, max_batch)
    step = CausalLMStep(model)
    ids, mask = _prompt(model, inputs)
    if inputs is not None and ids.shape[0] > max_batch:
        raise InvalidInputError(f"the example prompt has a batch of {ids.shape[0]}, beyond max_batch={max_batch}")
    if max_batch == 1:
        ids, mask = ids[:1], mask[:1]
    elif ids.shape[0] == 1:  # torch.export specializes a dim of size 1: trace a batch of 2
        ids, mask = ids.repeat(2, 1), mask.repeat(2, 1)
    prefill_inputs = {"input_ids": ids, "attention_mask": mask}
    if step.takes_position_ids:
        prefill_inputs["position_ids"] = positions_from_mask(mask)
    with torch.no_grad():
        cache = step(**prefill_inputs)["cache"]
    from torch.export import Dim

    batch = {0: Dim("batch", min=1, max=max_batch)} if max_batch > 1 else {}  # a batch of 1 is static
    prompt = Dim("prompt", min=1, max=max_cache_len)
    past = Dim("past", min=1, max=max_cache_len - 1)
    decode_inputs = {"input_ids": ids[:, -1:], "attention_mask": torch.cat([mask, torch.ones_like(mask[:, :1])], -1)}
    if step.takes_position_ids:
        decode_inputs["position_ids"] = prefill_inputs["position_ids"][:, -1:] + 1
    decode_inputs["cache"] = cache
    prefill_shapes = {name: {**batch, 1: prompt} for name in prefill_inputs}
    decode_shapes = {"input_ids": dict(batch) or None, "attention_mask": {**batch, 1: past + 1},
                     "cache": tuple(({**batch, 2: past}, {**batch, 2: past}) for _ in cache)}
    if step.takes_position_ids:
        decode_shapes["position_ids"] = dict(batch) or None
    return TaskPlan(task, [ComponentPlan("prefill", step, prefill_inputs, prefill_shapes),
                           ComponentPlan("decode", step, decode_inputs, decode_shapes)],
                    manifest={"generation": generation_manifest(model, max_cache_len, max_batch, len(cache))},
                    model=model)


# ── greedy decoding ─────────────────────────────────────────────────────────────────────────────────────


def generate(exported: Any, input_ids: Any, attention_mask: Any = None, *, max_new_tokens: int | None = None,
             eos_token_id: Any = _STORED, pad_token_id: int | None = None,
             **generation_options: Any) -> torch.Tensor:
    """Greedy decoding over an artifact's exported programs, on its backend's runtime.

    Matches ``model.generate(input_ids, attention_mask=..., do_sample=False, max_new_tokens=...)`` token for
    token: the stored generation config with these arguments applied, transformers' logits processors, a row
    that produced EOS continues with ``pad_token_id`` and generation stops when every row has.

    Args:
        exported: an :class:`~hfexport.ExportedModel` exported with a generative task.
        input_ids: ``int64 [batch, prompt]``, left-padded (decoders); the encoder's input for an encoder-decoder
            (``input_features`` ``float [batch, mels, frames]`` for speech).
        attention_mask: ``int64 [batch, prompt]``, 0 at padding (default: ones).
        max_new_tokens: the number of tokens to generate (required).
        eos_token_id: the id(s) that end a row (default: the generation config's; ``None`` never stops early).
        pad_token_id: the id written after a row's EOS (default: the generation config's, else the first EOS).
        **generation_options: other ``GenerationConfig`` fields (``min_new_tokens``, ``repetition_penalty``).

    Returns:
        ``int64 [batch, prompt + new]`` (decoders) or ``[batch, 1 + new]`` decoder ids (encoder-decoders). The
        timings are in ``exported.generation_stats`` (:class:`GenerationStats`).

    Raises:
        ValueError: no ``max_new_tokens``, sampling or beams asked for, prompt plus new tokens beyond
            ``max_cache_len``, a batch beyond ``max_batch``, or an EOS or pad id outside the vocabulary (each
            names the bound), before any program runs.
        TypeError: ``input_ids`` is not an integer tensor of rank 2, or an option is no ``GenerationConfig`` field.
    """
    section = exported.manifest["generation"]
    options = dict(generation_options)  # an option passed as None sets it to None, as in model.generate
    if max_new_tokens is not None:
        options["max_new_tokens"] = max_new_tokens
    if pad_token_id is not None:
        options["pad_token_id"] = pad_token_id
    if eos_token_id is not _STORED:
        options["eos_token_id"] = eos_token_id
    config = merged_generation_config(section, options)
    if exported.manifest.get("task") != TEXT_GENERATION:
        from ._seq2seq import generate_seq2seq

        return generate_seq2seq(exported, input_ids, attention_mask, config, section)
    input_ids, attention_mask = check_prompt(input_ids, attention_mask, config, section)
    eos = token_id_list(config.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None)
    processors = logits_processors(config, section, input_ids.shape[1], None)
    criteria = stopping_criteria(input_ids.shape[1] + config.max_new_tokens, eos)

    prefill_names = input_names(exported, "prefill")
    positions = positions_from_mask(attention_mask)
    start = time.perf_counter()
    feed = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions}
    out = exported.run("prefill", **{k: v for k, v in feed.items() if k in prefill_names})
    prefill_s = time.perf_counter() - start
    decode_names = input_names(exported, "decode")
    sequences, unfinished, steps = input_ids, torch.ones(input_ids.shape[0], dtype=torch.bool), 0
    start = time.perf_counter()
    while True:
        scores = processors(sequences, out["logits"].float())
        next_tokens = scores.argmax(-1)
        if pad is not None:
            next_tokens = torch.where(unfinished, next_tokens, torch.tensor(pad, dtype=next_tokens.dtype))
        sequences = torch.cat([sequences, next_tokens[:, None]], -1)
        unfinished &= ~criteria(sequences, scores)
        if not bool(unfinished.any()):
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], -1)
        positions = positions[:, -1:] + 1
        feed = {"input_ids": next_tokens[:, None], "attention_mask": attention_mask, "position_ids": positions,
                "cache": out["cache"]}
        out = exported.run("decode", **{k: v for k, v in feed.items() if k in decode_names})
        steps += 1
    decode_s = time.perf_counter() - start
    exported.generation_stats = GenerationStats(
        prefill_s=prefill_s, decode_s=decode_s, decode_steps=steps, new_tokens=sequences.shape[1] - input_ids.shape[1],
        decode_tokens_per_s=steps * input_ids.shape[0] / decode_s if decode_s > 0 and steps else float("nan"))
    return sequences


