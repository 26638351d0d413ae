"""What the OpenVINO stages hand on within one export (``ExportContext.state``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hfexport.plugin import ExportContext

from ._runner import OpenVINORunner

__all__ = ["OpenVINOState", "openvino_state"]


@dataclass
class OpenVINOState:
    """The OpenVINO stages' results, stage to stage.

    Attributes:
        prepared: the traced program after OpenVINO's decompositions and the FX node fixes (stage 3).
        graph: its graph module with the weights as constants and the mutable buffers as inputs and outputs
            (``_graph.constants_inlined``), taken by stage 4.
        program_states: the mutable buffers of the program (``_graph.ProgramState``), OpenVINO variables after
            stage 5.
        io: the model's input and output names per flattened leaf (``_naming.io_names``).
        model: the ``openvino.Model`` that ``openvino.convert_model`` made (stage 4), taken by stage 5.
        states: ``{variable: buffer}``: the OpenVINO variables stage 5 made of the mutable buffers (a KV cache).
        growing_states: ``{variable: {"input": name, "output": name}}``: the variables stage 3 made of a growing
            cache's inputs and outputs (``_graph.make_growing_stateful``).
        runner: the compiled model over the saved IR (stage 5).
        manifest: the component manifest's ``openvino`` section (stage 5).
        quantization: the component manifest's ``quantization`` section (``nncf.compress_weights``, stage 5); None
            for a float export.
    """

    prepared: Any = None
    graph: Any = None
    program_states: list[Any] = field(default_factory=list)
    io: dict[str, Any] = field(default_factory=dict)
    model: Any = None
    states: dict[str, str] = field(default_factory=dict)
    growing_states: dict[str, dict[str, str]] = field(default_factory=dict)
    runner: OpenVINORunner | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None


def openvino_state(ctx: ExportContext) -> OpenVINOState:
    """The :class:`OpenVINOState` of an OpenVINO export (``ctx.state``).

    Raises:
        TypeError: ``ctx`` is another backend's export context.
    """
    return ctx.state_as(OpenVINOState)
