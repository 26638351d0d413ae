"""``hfexport.commands`` entry point: the ExecuTorch backends' options on the kernel's ``hfexport export``.

Kept light: argparse only; nothing of the toolchain is imported. ``--max-batch`` (hfexport-dynamo's, with
``--dynamic``) bounds the batch; these bound the other dynamic dims of a ``--dynamic`` export, for which ExecuTorch
plans memory (``_bounds.py``).
"""

from __future__ import annotations

import argparse
from typing import Any


class _BackendValue(argparse.Action):
    """Put the value under ``dest`` (an ``ExecutorchConfig`` field) into ``namespace.backend_options``, which
    ``hfexport export`` passes to the backend's exporter (a backend without that field refuses it by name)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values < 1:
            parser.error(f"{option_string} must be a positive size, got {values}")
        namespace.backend_options = {**(getattr(namespace, "backend_options", None) or {}), self.dest: values}


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``--max-seq-len`` and ``--dim-upper-bound`` to ``hfexport export``."""
    export = subparsers.choices.get("export")
    if export is None:  # pragma: no cover - the kernel always has it
        return
    export.add_argument("--max-seq-len", dest="max_seq_len", type=int, metavar="N", action=_BackendValue,
                        default=argparse.SUPPRESS,
                        help="with --dynamic on executorch-*: the longest sequence (token inputs' dim 1, audio samples, "
                             "frames) the program takes; ExecuTorch plans memory for it (ExecutorchConfig.max_seq_len; "
                             "default the config's max_position_embeddings; from hfexport-executorch)")
    export.add_argument("--dim-upper-bound", dest="dim_upper_bound", type=int, metavar="N", action=_BackendValue,
                        default=argparse.SUPPRESS,
                        help="with --dynamic on executorch-*: the bound of the other dynamic dims "
                             "(ExecutorchConfig.dim_upper_bound, default 64; from hfexport-executorch)")
