"""A loaded text-generation artifact that transformers' ``pipeline("text-generation", model=...)`` takes as it is.

``hfexport.load(dir)`` makes the artifact of the class the tracer names for its manifest
(``DynamoTracer.artifact_class``): for ``task="text-generation"``, :class:`TextGenerationArtifact`, an
:class:`~hfexport.ExportedModel` (its API unchanged) that also answers what a transformers pipeline reads of its model
(``config``, ``generation_config``, ``device``, ``can_generate()``, ...) from :func:`~.transformers_model.as_transformers`'s
model over the same artifact, built on first use. Its ``generate`` keeps hfexport's greedy loop (the fast path) for
the calls that loop takes, and hands the others (sampling, beams, a ``generation_config``, streamers, logits
processors, stopping criteria: what a pipeline passes) to transformers' ``GenerationMixin.generate`` over the
runtime. Light: transformers is imported when the transformers model is first needed.
"""

from __future__ import annotations

from typing import Any

from hfexport import ExportedModel

__all__ = ["TextGenerationArtifact"]

# what transformers' pipelines read of their model (base.Pipeline.__init__, TextGenerationPipeline)
_PIPELINE_ATTRIBUTES = frozenset({"config", "generation_config", "device", "dtype", "can_generate", "to", "eval",
                                  "input_modalities", "output_modalities", "main_input_name", "name_or_path",
                                  "hf_device_map"})
# generate() options only transformers' GenerationMixin has (objects, or what hfexport's greedy loop refuses)
_TRANSFORMERS_OPTIONS = frozenset({"generation_config", "streamer", "logits_processor", "stopping_criteria",
                                   "prefix_allowed_tokens_fn", "synced_gpus", "assistant_model", "negative_prompt_ids",
                                   "negative_prompt_attention_mask", "return_dict_in_generate", "output_scores",
                                   "output_logits", "tokenizer", "use_model_defaults", "custom_generate"})


def wants_transformers(options: dict[str, Any]) -> bool:
    """Whether a ``generate`` call asks for what only transformers' ``GenerationMixin`` does: sampling, beams, or one
    of its objects and switches (a ``generation_config``, a streamer, logits processors, stopping criteria)."""
    return bool(_TRANSFORMERS_OPTIONS & options.keys()) or bool(options.get("do_sample")) \
        or (options.get("num_beams") or 1) > 1


class TextGenerationArtifact(ExportedModel):
    """A loaded ``"text-generation"`` artifact (see the module): an :class:`~hfexport.ExportedModel` that
    ``pipeline("text-generation", model=hfexport.load(dir), tokenizer=...)`` takes.

    Attributes:
        transformers_model: the :class:`~.transformers_model.ExportedModelForCausalLM` over this artifact (what
            ``as_transformers(self)`` returns), made on first use from the artifact's ``config.json``.
    """

    _transformers_model: Any = None

    @property
    def transformers_model(self) -> Any:
        if self._transformers_model is None:
            from .transformers_model import as_transformers

            self._transformers_model = as_transformers(self)
        return self._transformers_model

    def __getattr__(self, name: str) -> Any:
        """What a transformers pipeline reads of its model (``config``, ``device``, ``can_generate`` ...), from
        :attr:`transformers_model`; any other missing name is an ``AttributeError`` as usual."""
        if name not in _PIPELINE_ATTRIBUTES:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            model = self.transformers_model
        except ValueError as exc:  # no config.json to build it from: getattr(..., default) still works
            raise AttributeError(f"{name}: {exc}") from exc
        return getattr(model, name)

    def generate(self, input_ids: Any = None, attention_mask: Any = None, **options: Any) -> Any:
        """hfexport's greedy loop (:meth:`ExportedModel.generate`) for the calls it takes; sampling, beams, a
        ``generation_config``, streamers, logits processors and stopping criteria go to transformers'
        ``GenerationMixin.generate`` over the same runtime (the ids of a greedy call are the same either way)."""
        if wants_transformers(options):
            return self.transformers_model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
        return super().generate(input_ids, attention_mask, **options)
