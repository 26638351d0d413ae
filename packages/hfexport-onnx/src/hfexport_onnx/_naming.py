"""Readable ONNX graph input and output names: one per flattened pytree leaf (``input_ids``,
``cache.layers.0.keys``, ``logits``), written into the graph and into the manifest's ``onnx`` section.
The names are the kernel's (``NamedIORunner.io_names``), as OpenVINO's."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import onnx_ir as ir

from hfexport.plugin import NamedIORunner

__all__ = ["io_names", "name_graph_io"]

logger = logging.getLogger("hfexport")

io_names = NamedIORunner.io_names  # {input_leaves, output_leaves, output_constants, int_outputs}: the onnx section's


def name_graph_io(graph: ir.Graph, io: Mapping[str, Any]) -> None:
    """Rename the graph's inputs and outputs to ``io``'s leaf names (the leaves that are not constants)."""
    _name_graph_inputs(graph, [n for n in io["input_leaves"] if n is not None])
    _name_graph_outputs(graph, [n for n in io["output_leaves"] if n is not None])


def _all_value_names(graph: ir.Graph) -> dict[str, ir.Value]:
    values: dict[str, ir.Value] = {}
    for v in (*graph.inputs, *graph.initializers.values()):
        if v.name:
            values[v.name] = v
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for v in node.outputs:
            if v.name:
                values[v.name] = v
    return values


def _rename(graph: ir.Graph, value: ir.Value, name: str) -> None:
    """Give ``value`` the name ``name``; another value already called so is renamed out of the way."""
    if value.name == name:
        return
    other = _all_value_names(graph).get(name)
    if other is not None and other is not value:
        other.name = f"{name}__{id(other):x}"
    value.name = name


def _name_graph_inputs(graph: ir.Graph, names: list[str]) -> None:
    if len(graph.inputs) != len(names):
        logger.warning("ONNX graph has %d inputs for %d tensor input leaves: keeping torch.onnx's input names",
                       len(graph.inputs), len(names))
        return
    for value, name in zip(graph.inputs, names, strict=True):
        _rename(graph, value, name)


def _name_graph_outputs(graph: ir.Graph, names: list[str]) -> None:
    """Name the outputs; one that is a graph input or repeats an earlier output goes through an ``Identity``."""
    if len(graph.outputs) != len(names):
        logger.warning("ONNX graph has %d outputs for %d tensor output leaves: keeping torch.onnx's output names",
                       len(graph.outputs), len(names))
        return
    seen: set[int] = set()
    for index, (value, name) in enumerate(zip(list(graph.outputs), names, strict=True)):
        if value.is_graph_input() or id(value) in seen or value.is_initializer():
            identity = ir.node("Identity", [value])
            out = identity.outputs[0]
            out.shape, out.type = value.shape, value.type
            graph.append(identity)
            graph.outputs[index] = value = out
        seen.add(id(value))
        _rename(graph, value, name)
