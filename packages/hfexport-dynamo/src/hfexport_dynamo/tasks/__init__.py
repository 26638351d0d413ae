"""The generation layer: what a generative task exports (``plan_task``) and the one greedy loop over an artifact's
programs (``generate``), for every task of :data:`TASKS`.

* :mod:`.names`, :mod:`.options`: the task names and their options (light: no torch);
* :mod:`.causal_lm`: ``"text-generation"``, one ``decoder`` program over a KV cache of fixed capacity;
* :mod:`.seq2seq`: ``"text2text-generation"``, ``"automatic-speech-recognition"``: ``encoder``, ``prefill`` and
  ``decode`` programs;
* :mod:`.image_text`, :mod:`.image_prompt`: ``"image-text-to-text"``, ``"audio-text-to-text"``: the media and
  ``embed`` programs beside the text ``decoder``, and the merge of the media into the prompt;
* :mod:`.decoding`: the greedy loop and what it shares with transformers (the generation config, logits
  processors, stopping criteria);
* :mod:`.transformers_model`: a text-generation artifact as a transformers model (:func:`as_transformers`), for
  ``GenerationMixin.generate`` and ``pipeline("text-generation", ...)``;
* :mod:`.cli`: ``hfexport export --task`` and ``hfexport generate``.

Importing this package is light (the backends' declarations and the CLI read :data:`TASKS`): torch is imported when
a task is planned or an artifact generates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .names import IMAGE_TEXT_TO_TEXT, MEDIA_TASKS, TASKS, TEXT_GENERATION
from .options import GenerationOptions, ImageTextOptions, TaskOptions, options_for_task

__all__ = ["TASKS", "GenerationOptions", "ImageTextOptions", "TaskOptions", "as_transformers", "generate",
           "options_for_task", "plan_task"]


def as_transformers(exported: Any, config: Any = None) -> Any:
    """``exported`` (a ``"text-generation"`` artifact) as a transformers ``PreTrainedModel`` + ``GenerationMixin``:
    :func:`.transformers_model.as_transformers` (imports transformers)."""
    from .transformers_model import as_transformers as wrap

    return wrap(exported, config)


def plan_task(model: Any, task: str, inputs: Mapping[str, Any] | None = None, *, max_cache_len: int | None = None,
              max_batch: int | None = None, prefill_chunk: int | None = None, max_images: int | None = None,
              stateful: bool = False, fused_cache_attention: Any = False, growing: bool = False) -> Any:
    """The components (a ``TaskPlan``) to export for ``task``, bounded as asked (the arguments are documented by
    each task's planner): ``"text-generation"``: :func:`.causal_lm.plan_causal_lm`; ``"text2text-generation"``,
    ``"automatic-speech-recognition"``: :func:`.seq2seq.plan_seq2seq` (``max_cache_len`` and ``max_batch`` only);
    ``"image-text-to-text"``, ``"audio-text-to-text"``: :func:`.image_text.plan_image_text`. ``growing``
    (``RuntimeNeeds(cache_layout="growing")``): ``"text-generation"``'s cache grows with the sequence and the runtime
    keeps it (:func:`.causal_lm.plan_causal_lm`); the other tasks take ``stateful`` then.

    Raises:
        ValueError: an unknown task (lists them), or bounds the model cannot take (says which).
        TypeError: ``max_images`` for a task without images.
        hfexport.InvalidInputError: the model cannot generate for ``task`` (says why and what to do instead).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    bounds = {"max_cache_len": max_cache_len, "max_batch": max_batch}
    decoder = {**bounds, "prefill_chunk": prefill_chunk, "stateful": stateful,
               "fused_cache_attention": fused_cache_attention}
    if task in MEDIA_TASKS:
        from .image_text import plan_image_text

        return plan_image_text(model, inputs, task=task, max_images=max_images, **decoder)
    if max_images is not None:
        raise TypeError(f"max_images is an option of task {IMAGE_TEXT_TO_TEXT!r}, not of {task!r}")
    if task == TEXT_GENERATION:
        from .causal_lm import plan_causal_lm

        if growing:
            return plan_causal_lm(model, inputs, **{**decoder, "stateful": False, "fused_cache_attention": False},
                                  growing=True)
        return plan_causal_lm(model, inputs, **decoder)
    from .seq2seq import plan_seq2seq

    return plan_seq2seq(model, task, inputs, **bounds)


def generate(exported: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any:
    """Greedy decoding over a task artifact's programs on its backend's runtime: the one loop,
    :func:`.decoding.generate` (which documents the options and what it returns), with the task's part:
    ``"text-generation"``: :func:`.causal_lm.prepare_decoder`; the encoder-decoders: :func:`.seq2seq.
    prepare_seq2seq`; the image- and audio-text tasks: :func:`.image_prompt.prepare_media`."""
    from .decoding import generate as greedy_generate

    task = exported.manifest.get("task")
    if task == TEXT_GENERATION:
        from .causal_lm import prepare_decoder as prepare
    elif task in MEDIA_TASKS:
        from .image_prompt import prepare_media as prepare
    else:
        from .seq2seq import prepare_seq2seq as prepare
    return greedy_generate(exported, prepare, input_ids, attention_mask, **options)
