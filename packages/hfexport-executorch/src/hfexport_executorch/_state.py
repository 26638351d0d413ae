"""What the ExecuTorch stages, and the patches and fixes they install, hand on within one export
(``ExportContext.state``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from hfexport.plugin import ExportContext

from ._bounds import DimBounds
from ._runner import ExecutorchRunner
from ._variants import BackendPreparation

__all__ = ["ExecutorchState", "executorch_state"]


@dataclass
class ExecutorchState:
    """The ExecuTorch stages' results, stage to stage.

    Attributes:
        preparation: the variant's device, dtype, partitioners and decompositions (stage 1; empty when its
            preparation is disabled).
        admitted_ops: ops outside Core ATen that ``_patch_aten_dialect_verifier`` admitted because a portable
            kernel runs them (stage 3 on); the manifest lists them.
        initialized_buffers: mutable buffers whose initial value the program now stores
            (``_patch_mutable_buffer_initial_state``, in the step ``to_executorch``).
        dim_bounds: the upper bounds given to the dynamic dims (the step ``bound dynamic dims (memory budget)``
            after stage 4); None until then.
        runner: the runtime's program over the lowered, emitted bytes (stage 5).
        manifest: the component manifest's ``executorch`` section (stage 5).
        quantization: the component manifest's ``quantization`` section, without the program's size (stage 1 or
            4); None for a float export.
        held: the contexts ``prepare`` enters for capture and lowering (quiet notices, the CIA-op cache); ``lower``
            closes them as its last line, the kernel's stack only when the export fails before.
    """

    preparation: BackendPreparation = field(default_factory=BackendPreparation)
    admitted_ops: list[str] = field(default_factory=list)
    initialized_buffers: list[str] = field(default_factory=list)
    dim_bounds: DimBounds | None = None
    runner: ExecutorchRunner | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


def executorch_state(ctx: ExportContext) -> ExecutorchState:
    """The :class:`ExecutorchState` of an ExecuTorch export (``ctx.state``).

    Raises:
        TypeError: ``ctx`` is another backend's export context.
    """
    # isinstance here, not ctx.state_as: the fixes and patches read it while the kernel applies them
    if not isinstance(ctx.state, ExecutorchState):
        raise TypeError(f"expected the context of an export whose state is an ExecutorchState; got "
                        f"{type(ctx.state).__name__} from {type(ctx.exporter).__name__}")
    return ctx.state
