"""A text-generation artifact as a transformers model: :func:`as_transformers` wraps an
:class:`~hfexport.ExportedModel` into :class:`ExportedModelForCausalLM`, a ``PreTrainedModel`` with
``GenerationMixin``, so that ``model.generate(...)`` (sampling, top-k/top-p, repetition penalty, streamers,
stopping criteria, ...) and ``pipeline("text-generation", model=..., tokenizer=...)`` run over the artifact's
``decoder`` program on its runtime (ONNX Runtime, ExecuTorch, OpenVINO, torch).

transformers does the decoding; the runtime does the forward and owns the cache. The first forward of a ``generate``
call prefills the prompt (in chunks of ``prefill_chunk``) into a new cache of the artifact's capacity
(:class:`~hfexport_dynamo.tasks.causal_lm.DecoderPrograms`, as hfexport's own loop), and returns it as ``cache``;
``generate`` hands it back with each new token, which is written at the next position in place. The logits returned
are the last position's, ``[batch, 1, vocab]`` (what ``generate`` reads).

hfexport's greedy loop (``exported.generate``) stays the fast path; both give the same ids under greedy decoding.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .causal_lm import decoder_run
from .names import TEXT_GENERATION

__all__ = ["ExportedModelForCausalLM", "RuntimeCache", "as_transformers"]


class RuntimeCache:
    """The cache of one ``generate`` call, kept by the runtime: the ``decoder`` program's run state (the cache of
    ``max_cache_len`` positions, the mask, the positions) and the runner's context (ONNX Runtime's bound inputs).

    Attributes:
        seen: the positions written (prompt + decode steps).
    """

    is_compileable = False

    def __init__(self, programs: Any, capacity: int, seen: int):
        self.programs, self.capacity, self.seen = programs, capacity, seen
        self._context = contextlib.ExitStack()
        self._context.enter_context(programs.running())

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def close(self) -> None:
        """Release the runner's context (the bound inputs); a later step raises."""
        self._context.close()
        self.programs = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._context.close()


class ExportedModelForCausalLM(PreTrainedModel, GenerationMixin):
    """A transformers causal LM whose forward runs a text-generation artifact's ``decoder`` program.

    Made by :func:`as_transformers`. Holds no weights: ``parameters()`` is empty, and the device is the CPU.

    Forward:
        input_ids: ``int64 [batch, seq]``: the whole prompt (no ``cache``: a new cache is prefilled), or the one new
            token per row (with the ``cache`` this model returned).
        attention_mask: ``int64 [batch, past + seq]``, 0 at left padding (default: ones).
        cache: the :class:`RuntimeCache` returned by the previous forward of this ``generate`` call.

    Returns:
        ``CausalLMOutputWithPast`` with ``logits`` ``float [batch, 1, vocab]`` (the last position's) and ``cache``.

    Raises:
        ValueError: a prompt beyond the export's ``max_batch`` or ``max_cache_len``, a decode step past
            ``max_cache_len`` (raise it at export: ``max_cache_len=``), a decode step of more than one token, or ids
            outside the vocabulary; each names the bound.
    """

    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: PretrainedConfig, exported: Any):
        super().__init__(config)
        self.exported = exported
        self.section = exported.manifest["generation"]
        self.generation_config = GenerationConfig.from_dict(dict(self.section.get("generation_config") or {}))
        self._last: RuntimeCache | None = None

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the runtime keeps the cache: generate makes none, forward returns a RuntimeCache

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def can_generate(self) -> bool:  # type: ignore[override]
        return True

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, next_sequence_length: int | None = None,
                                      cache: RuntimeCache | None = None,
                                      attention_mask: torch.Tensor | None = None, **kwargs: Any) -> dict[str, Any]:
        if cache is not None:
            input_ids = input_ids[:, -1:]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "cache": cache}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: RuntimeCache | None = None, **kwargs: Any) -> CausalLMOutputWithPast:
        if cache is None:
            if self._last is not None:  # the previous generate call's cache: its bound inputs released
                self._last.close()
            cache = self._prefill_cache(input_ids, attention_mask)
            logits = cache.last_logits
            del cache.last_logits
        else:
            if cache.programs is None:
                raise ValueError("this cache belongs to an earlier generate call; start again from the prompt")
            if input_ids.shape[1] != 1:
                raise ValueError(f"a decode step takes one token per row, got input_ids of shape "
                                 f"{list(input_ids.shape)}")
            if cache.seen >= cache.capacity:
                raise ValueError(f"the cache is full: this export holds max_cache_len={cache.capacity} positions "
                                 f"(prompt + new tokens); export with a larger max_cache_len=, or ask for fewer "
                                 "max_new_tokens")
            logits = cache.programs.step(input_ids[:, 0].long())
            cache.seen += 1
        return CausalLMOutputWithPast(logits=logits.float()[:, None, :].clone(), cache=cache)

    def _prefill_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> RuntimeCache:
        from .decoding import check_prompt

        config = GenerationConfig(max_new_tokens=1)  # the bounds: the prompt and one new token
        input_ids, attention_mask = check_prompt(input_ids, attention_mask, config, self.section)
        run = decoder_run(self.exported, self.section, config, input_ids, attention_mask)
        cache = RuntimeCache(run.programs, self.section["max_cache_len"], input_ids.shape[1])
        for span in run.programs.prefill_spans:
            logits = run.programs.prefill(span)
        cache.last_logits = logits
        self._last = cache
        return cache

    def _init_weights(self, module: torch.nn.Module) -> None:
        pass


def as_transformers(exported: Any, config: PretrainedConfig | None = None) -> ExportedModelForCausalLM:
    """Wrap a text-generation artifact (``hfexport.load(dir)`` or ``hfexport.export(..., task="text-generation")``)
    into a transformers model that ``generate`` and ``pipeline("text-generation", ...)`` take.

    Args:
        exported: an :class:`~hfexport.ExportedModel` of task ``"text-generation"``.
        config: the model's config (default: the artifact's ``config.json``, for a loaded artifact).

    Returns:
        An :class:`ExportedModelForCausalLM` over ``exported``'s ``decoder`` program.

    Raises:
        ValueError: the artifact was exported for another task, or there is no config to read (an artifact that
            was not saved: pass ``config=model.config``).
    """
    task = exported.manifest.get("task")
    if task != TEXT_GENERATION:
        raise ValueError(f"as_transformers() takes a {TEXT_GENERATION!r} artifact; this one was exported for "
                         f"{f'task {task!r}' if task else 'one forward pass'}: export with task='text-generation'")
    if config is None:
        config = _checked_config(exported)
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return ExportedModelForCausalLM(config, exported)


_CONFIG_MAX_BYTES = 2**22  # a model's config.json: 4 MiB, as a tokenizer's configs


def _checked_config(exported: Any) -> PretrainedConfig:
    """The config of a loaded artifact from its ``config.json`` as the bytes its manifest hashes (read once from a
    descriptor and checked on those bytes, ``hfexport.trust.artifact_bytes``: no path opened again after ``load``'s
    check, issue 43), built by its ``model_type``'s class (``CONFIG_MAPPING``: no ``auto_map``, no code of the
    artifact's), else as plain fields (``generate`` reads few of them).

    Raises:
        ValueError: no hashed config.json (the artifact was not saved and loaded), one over 4 MiB or not a JSON
            object; ``hfexport.IntegrityError``: it changed since ``load``.
    """
    from transformers import CONFIG_MAPPING

    from hfexport.trust import artifact_bytes

    directory, manifest = getattr(exported, "directory", None), getattr(exported, "manifest", None) or {}
    hashed = manifest.get("files_sha256")
    known = hashed if isinstance(hashed, dict) else [f for f in manifest.get("files") or () if isinstance(f, str)]
    if directory is None or "config.json" not in known:
        raise ValueError("this artifact has no config.json its manifest hashes (it was not saved and loaded): pass "
                         "config=model.config")
    entry = known["config.json"] if isinstance(known, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("size"), int) and entry["size"] > _CONFIG_MAX_BYTES:
        raise ValueError(f"{Path(directory) / 'config.json'} is {entry['size']:,} bytes, over the "
                         f"{_CONFIG_MAX_BYTES:,} a config may have: the artifact is damaged or crafted")
    data = artifact_bytes(Path(directory), manifest, "config.json", "config.json")
    try:  # json, not parse_json: configs may hold 31-digit ints; size-bounded above
        values = json.loads(bytes(data).decode("utf-8"))  # UTF-8 only: no codec module imported for UTF-16/32
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{Path(directory) / 'config.json'} is not JSON hfexport reads ({type(exc).__name__}): "
                         "the artifact is damaged or crafted") from None
    if not isinstance(values, dict):
        raise ValueError(f"{Path(directory) / 'config.json'} is not a JSON object: the artifact is damaged or crafted")
    model_type = values.get("model_type")
    known_type = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    try:  # a model_type transformers knows; else the plain fields
        return (CONFIG_MAPPING[model_type] if known_type else PretrainedConfig).from_dict(values)
    except (ValueError, KeyError, TypeError):
        return PretrainedConfig.from_dict(values)
