"""The options of the generation tasks, as dataclasses: ``hfexport.export(..., task=..., max_cache_len=...)`` builds
one from its keyword arguments by field name (``DynamoTracer.task_options``), and it is checked where it is made."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .names import IMAGE_TEXT_TO_TEXT, MEDIA_TASKS, TASKS, TEXT_GENERATION

__all__ = ["GenerationOptions", "ImageTextOptions", "TaskOptions", "options_for_task"]


@dataclass(frozen=True)
class TaskOptions:
    """Options every generation task takes; alone, those of ``"text2text-generation"`` and
    ``"automatic-speech-recognition"`` (their programs take the whole decoder prompt at once).

    Attributes:
        max_cache_len: the most positions a sequence may hold, prompt and new tokens: the KV cache's capacity
            (default ``max_position_embeddings`` capped at 4,096 and at a sliding window; encoder-decoders 256).
        max_batch: the largest batch (default 1).

    Raises:
        TypeError: an option that is not a positive int (or None).
    """

    max_cache_len: int | None = None
    max_batch: int | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise TypeError(f"{field.name} must be a positive int (or None for its default), got {value!r} "
                                f"({type(value).__name__})")


@dataclass(frozen=True)
class GenerationOptions(TaskOptions):
    """Options of ``"text-generation"`` and ``"audio-text-to-text"``: :class:`TaskOptions`, and

    Attributes:
        prefill_chunk: the most prompt tokens one call takes, the bound of the ``seq`` dim (default
            ``min(256, max_cache_len)``); a longer prompt is prefilled in chunks.
    """

    prefill_chunk: int | None = None


@dataclass(frozen=True)
class ImageTextOptions(GenerationOptions):
    """Options of ``"image-text-to-text"``: :class:`GenerationOptions`, and

    Attributes:
        max_images: the most images one call of ``generate`` takes (default ``max_batch``).
    """

    max_images: int | None = None


def options_for_task(task: str) -> type[TaskOptions]:
    """The options dataclass of ``task``.

    Raises:
        ValueError: an unknown task (lists them).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    if task == IMAGE_TEXT_TO_TEXT:
        return ImageTextOptions
    return GenerationOptions if task in (TEXT_GENERATION, *MEDIA_TASKS) else TaskOptions
