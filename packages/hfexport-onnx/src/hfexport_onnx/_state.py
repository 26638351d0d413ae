"""What the ONNX stages hand on within one export (``ExportContext.state``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hfexport.plugin import ExportContext
from hfexport.workarounds import FixReport

from ._runner import OnnxRunner

__all__ = ["OnnxState", "onnx_state"]


@dataclass
class OnnxState:
    """The ONNX stages' results, stage to stage.

    Attributes:
        decomposition_fixes: the FX node fixes (stage 3's) that fired on the program torch.onnx's decomposition made
            (the step ``ExportedProgram.run_decompositions`` of ``lower``).
        translations: the custom translations of stage 4's table, by function name.
        program: ``torch.onnx.export``'s ``ONNXProgram`` (stage 4), taken by stage 5, which frees it.
        io: the graph's input and output names per flattened leaf (``_naming.io_names``).
        runner: the ONNX Runtime session over the final model (stage 5).
        manifest: the component manifest's ``onnx`` section (stage 5).
        quantization: the component manifest's ``quantization`` section; None for a float export.
    """

    decomposition_fixes: FixReport = field(default_factory=FixReport)
    translations: list[str] = field(default_factory=list)
    program: Any = None
    io: dict[str, Any] = field(default_factory=dict)
    runner: OnnxRunner | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None


def onnx_state(ctx: ExportContext) -> OnnxState:
    """The :class:`OnnxState` of an ONNX export (``ctx.state``).

    Raises:
        TypeError: ``ctx`` is another backend's export context.
    """
    return ctx.state_as(OnnxState)
