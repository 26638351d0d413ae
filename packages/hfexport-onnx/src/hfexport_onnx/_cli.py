"""``hfexport.commands`` entry point: the ``onnx`` backend's options on the kernel's ``hfexport export``.

Kept light: argparse only; nothing of the toolchain is imported.
"""

from __future__ import annotations

import argparse
from typing import Any


class _BackendOption(argparse.Action):
    """Put ``const`` (config options) into ``namespace.backend_options``, which ``hfexport export`` passes to the
    backend's exporter."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        namespace.backend_options = {**(getattr(namespace, "backend_options", None) or {}), **self.const}


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``--no-ort-fusions`` to ``hfexport export``."""
    export = subparsers.choices.get("export")
    if export is None:  # pragma: no cover - the kernel always has it
        return
    export.add_argument("--no-ort-fusions", action=_BackendOption, nargs=0, const={"ort_fusions": None},
                        help="with --backend onnx: write plain ONNX ops, without ONNX Runtime's fused attention, "
                             "norms and GELU (OnnxConfig(ort_fusions=None); from hfexport-onnx)")
