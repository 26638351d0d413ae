"""The files OpenVINO GenAI's ``LLMPipeline`` reads beside ``openvino_model.xml``, written into a text-generation
artifact whose cache grows (``kv_cache="growing"``), so that ``openvino_genai.LLMPipeline(<artifact>/decoder,
"CPU")`` runs it as it is: ``config.json`` and ``generation_config.json`` of the model (its EOS and generation
defaults), and, when a tokenizer is given and ``openvino_tokenizers`` converts it, ``openvino_tokenizer.xml`` /
``openvino_detokenizer.xml`` (with their ``.bin``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

__all__ = ["GenAIFiles"]

TOKENIZER_FILES = ("openvino_tokenizer", "openvino_detokenizer")


class GenAIFiles:
    """What an export writes for OpenVINO GenAI (see the module), prepared once: the model's configs as JSON, the
    tokenizer converted to OpenVINO models.

    Args:
        model: the Transformers model (its ``config`` and ``generation_config``).
        tokenizer: a Transformers tokenizer, a folder it loads from (``AutoTokenizer.from_pretrained``), or None.

    Attributes:
        manifest: ``{"files": [...], "tokenizer": "converted" | "none given" | "not converted: <why>"}`` for the
            component manifest's ``openvino.genai`` section.
    """

    def __init__(self, model: Any, tokenizer: Any = None):
        self.configs: dict[str, str] = {"config.json": model.config.to_json_string()}
        generation = getattr(model, "generation_config", None)
        if generation is not None:
            self.configs["generation_config.json"] = json.dumps(generation.to_dict(), indent=2, sort_keys=True)
        self.tokenizers: dict[str, Any] = {}
        status = "none given"
        if tokenizer is not None:
            try:
                self.tokenizers = _converted(tokenizer)
                status = "converted"
            except Exception as exc:  # noqa: BLE001 - the artifact still runs in LLMPipeline on token ids
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                status = f"not converted: {type(exc).__name__}: {first}"
                warnings.warn(f"openvino_tokenizers could not convert the tokenizer ({first}); OpenVINO GenAI's "
                              "LLMPipeline then takes token ids only (openvino_genai.TokenizedInputs)", stacklevel=3)
        names = [*self.configs, *(f"{n}.{ext}" for n in self.tokenizers for ext in ("xml", "bin"))]
        self.manifest = {"files": names, "tokenizer": status}

    def write(self, directory: Path) -> list[str]:
        """Write the files into ``directory`` (the component's folder, beside ``openvino_model.xml``); their names."""
        import openvino

        for name, text in self.configs.items():
            (Path(directory) / name).write_text(text)
        for name, model in self.tokenizers.items():
            openvino.save_model(model, Path(directory) / f"{name}.xml")
        return list(self.manifest["files"])


def _converted(tokenizer: Any) -> dict[str, Any]:
    """``{"openvino_tokenizer": model, "openvino_detokenizer": model}`` from ``openvino_tokenizers.convert_tokenizer``.

    Raises:
        ImportError: openvino-tokenizers is not installed (says what to install).
        Exception: what the conversion raised (a tokenizer it cannot convert).
    """
    try:
        from openvino_tokenizers import convert_tokenizer
    except ImportError as exc:
        raise ImportError("pip install openvino-tokenizers (of the installed openvino's release) to write the "
                          "tokenizer for OpenVINO GenAI") from exc
    if isinstance(tokenizer, str | Path):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    encoder, decoder = convert_tokenizer(tokenizer, with_detokenizer=True)
    return dict(zip(TOKENIZER_FILES, (encoder, decoder), strict=True))
