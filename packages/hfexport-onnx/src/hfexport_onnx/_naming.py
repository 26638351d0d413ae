"""Readable ONNX graph input and output names: one per flattened pytree leaf (``input_ids``,
``cache.layers.0.keys``, ``logits``), written into the graph and into the manifest's ``onnx`` section."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from hfexport.plugin import flatten_with_names

__all__ = ["io_names", "name_graph_io"]

logger = logging.getLogger("hfexport")


def _readable(name: str, taken: set[str], default: str) -> str:
    if not name or name.replace(".", "").isdigit():
        name = f"{default}_{name.replace('.', '_')}" if name else default
    base, i = name, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def io_names(program: torch.export.ExportedProgram, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Readable graph input/output names for every flattened leaf (``None`` for leaves that are constants).

    Returns:
        ``input_leaves`` and ``output_leaves`` (a name or ``None`` per leaf), ``output_constants``
        (``{leaf index: value}`` of the outputs that are constants) and ``int_outputs`` (the indices of the outputs
        that are Python ints computed from dynamic dims, SymInts: torch.onnx makes each an int64 graph output, and
        the runner gives it back as an int; MaskFormer-Swin's spatial sizes), as the manifest's ``onnx`` section
        holds them.
    """
    from torch.export.graph_signature import ConstantArgument, SymIntArgument, TensorArgument

    sig = program.graph_signature
    user_inputs = [s for s in sig.input_specs if s.kind.name == "USER_INPUT"]
    input_names, _, _ = flatten_with_names(dict(inputs))
    taken: set[str] = set()
    input_leaves: list[str | None] = []
    if len(input_names) != len(user_inputs):  # cannot happen for a traced signature; keep torch's names then
        input_names = [getattr(s.arg, "name", "") for s in user_inputs]
    for name, spec in zip(input_names, user_inputs, strict=True):
        input_leaves.append(_readable(name, taken, "input") if isinstance(spec.arg, TensorArgument) else None)
    out_spec = program.call_spec.out_spec
    # Tensor placeholders, not ints: cache types flatten by walking their tensor-valued attributes.
    placeholders = [torch.empty(0) for _ in range(out_spec.num_leaves)]
    output_names, _, _ = flatten_with_names(pytree.tree_unflatten(placeholders, out_spec))
    user_outputs = [s for s in sig.output_specs if s.kind.name == "USER_OUTPUT"]
    output_leaves: list[str | None] = []
    constants: dict[str, Any] = {}
    int_outputs: list[int] = []
    for i, (name, spec) in enumerate(zip(output_names, user_outputs, strict=True)):
        if isinstance(spec.arg, TensorArgument | SymIntArgument):
            output_leaves.append(_readable(name, taken, "output"))  # a bare tensor output is called "output"
            if isinstance(spec.arg, SymIntArgument):
                int_outputs.append(i)
        else:
            output_leaves.append(None)
            constants[str(i)] = spec.arg.value if isinstance(spec.arg, ConstantArgument) else None
    return {"input_leaves": input_leaves, "output_leaves": output_leaves, "output_constants": constants,
            "int_outputs": int_outputs}


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
