"""The names of an OpenVINO model's inputs and outputs: one per flattened pytree leaf of the traced program
(``input_ids``, ``past_key_values.layers.0.keys``, ``last_hidden_state``), set on the model and kept in the
manifest's ``openvino`` section. The names are the kernel's (``NamedIORunner.io_names``), as ONNX's."""

from __future__ import annotations

from typing import Any

from hfexport.plugin import NamedIORunner

__all__ = ["io_names", "name_model_io"]


io_names = NamedIORunner.io_names  # {input_leaves, output_leaves, output_constants, int_outputs}: the openvino
# section's; SymInt outputs come back as 0-d int64 tensors (``_graph.symint_outputs_as_tensors``)


def name_model_io(model: Any, inputs: list[str], outputs: list[str],
                  placeholders: list[str] | None = None) -> list[str]:
    """Give ``model``'s (an ``openvino.Model``) inputs and outputs the names ``inputs`` and ``outputs``, in order.

    ``placeholders`` (the converted graph's placeholder names, one per name of ``inputs``): where the model has fewer
    inputs, OpenVINO's FX decoder dropped a placeholder no node reads (an input aliased by another, c03's
    ``q = k = v``); the model's inputs are then matched by the placeholder name the decoder gave them.

    Returns:
        The names of ``inputs`` that the model has no input for (dropped, unused).

    Raises:
        RuntimeError: the model has another number of inputs or outputs than names are given (and, for inputs, no
            placeholder name tells them apart).
    """
    dropped: list[str] = []
    if placeholders is not None and len(placeholders) == len(inputs) and len(model.inputs) < len(inputs):
        by_placeholder = dict(zip(placeholders, inputs, strict=True))
        matched = []
        for port in model.inputs:
            names = [by_placeholder[n] for n in port.get_names() if n in by_placeholder]
            if len(names) != 1:
                break
            matched.append(names[0])
        else:
            dropped = [name for name in inputs if name not in matched]
            inputs = matched
    for kind, ports, wanted in (("inputs", model.inputs, inputs), ("outputs", model.outputs, outputs)):
        if len(ports) != len(wanted):
            raise RuntimeError(f"openvino.convert_model made a model with {len(ports)} {kind} for the program's "
                               f"{len(wanted)} tensor {kind} ({', '.join(wanted)})")
        for port, name in zip(ports, wanted, strict=True):
            port.get_tensor().set_names({name})
    return dropped
