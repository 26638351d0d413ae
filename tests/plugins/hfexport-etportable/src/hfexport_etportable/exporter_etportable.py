"""PortableExporter: the ExecuTorch exporter with the variant ``portable`` (no partitioner, portable kernels only)."""

from __future__ import annotations

from typing import ClassVar

import torch

from hfexport.plugin import ExportContext
from hfexport_executorch import (
    BackendPreparation,
    ExecutorchExporter,
    place_model_and_inputs,
    register_backend_prepare,
)


@register_backend_prepare("portable")
def prepare_for_portable(ctx: ExportContext) -> BackendPreparation:
    """CPU, float32, contiguous inputs and no partitioner: every op runs on ExecuTorch's portable kernels.

    **Why**: a reference variant (no delegate), useful to tell a delegate's bug from a lowering bug.
    **Upstream**: n/a.
    **Remove when**: never: this is the variant's definition.
    """
    place_model_and_inputs(ctx, "cpu", torch.float32)
    return BackendPreparation([], dtype=torch.float32)


class PortableExporter(ExecutorchExporter):
    """``executorch-portable``: an ExecuTorch program with no delegate."""

    name: ClassVar[str] = "executorch-portable"
    variant: ClassVar[str | None] = "portable"
