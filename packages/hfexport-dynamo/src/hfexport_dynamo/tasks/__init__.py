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
* :mod:`.cli`: ``hfexport export --task`` and ``hfexport generate``.

Importing this package is light (the backends' declarations and the CLI read :data:`TASKS`): torch is imported when
a task is planned or an artifact generates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .names import MEDIA_TASKS, TASKS
from .options import GenerationOptions, MediaGenerationOptions, options_for_task

__all__ = ["TASKS", "GenerationOptions", "MediaGenerationOptions", "generate", "options_for_task", "plan_task"]


def plan_task(model: Any, task: str, inputs: Mapping[str, Any] | None = None, *, max_cache_len: int | None = None,
              max_batch: int | None = None, prefill_chunk: int | None = None, max_images: int | None = None,
              stateful: bool = False, fused_cache_attention: Any = False) -> Any:
    """The components (a ``TaskPlan``) to export for ``task``, bounded as asked: ``"text-generation"``:
    :func:`.causal_lm.plan_task` (the arguments are documented there); ``"image-text-to-text"``,
    ``"audio-text-to-text"``: :func:`.image_text.plan_image_text`.

    Raises:
        ValueError: an unknown task (lists them), or bounds the model cannot take (says which).
        hfexport.InvalidInputError: the model cannot generate for ``task`` (says why and what to do instead).
    """
    bounds = {"max_cache_len": max_cache_len, "max_batch": max_batch, "prefill_chunk": prefill_chunk,
              "stateful": stateful, "fused_cache_attention": fused_cache_attention}
    if task in MEDIA_TASKS:
        from .image_text import plan_image_text

        return plan_image_text(model, inputs, task=task, max_images=max_images, **bounds)
    from .causal_lm import plan_task as plan

    return plan(model, task, inputs, max_images=max_images, **bounds)


def generate(exported: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any:
    """Greedy decoding over a task artifact's programs on its backend's runtime (:func:`.causal_lm.generate`
    documents the options)."""
    from .causal_lm import generate as decode

    return decode(exported, input_ids, attention_mask, **options)
