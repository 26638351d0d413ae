"""Checks and stamps on an ``onnx_ir.Model``: the opset it needs, its ``pkg.hfexport.*`` metadata, its size."""

from __future__ import annotations

import contextlib
from typing import Any

import onnx
import onnx_ir as ir

__all__ = ["MACHINE_METADATA", "MIN_OPSET", "TORCHLIB_OPSET", "UnsupportedOpsetError", "check_opset",
           "drop_machine_metadata", "node_count", "stamp_metadata"]

TORCHLIB_OPSET = 18  # the opset torch.onnx's function library (torchlib) is written for
MIN_OPSET = 7  # the lowest opset the ONNX version converter handles


class UnsupportedOpsetError(ValueError):
    """The graph cannot be expressed in the requested ONNX opset."""


def _graphs(model: ir.Model) -> tuple[Any, ...]:
    return (model.graph, *model.functions.values())


def check_opset(model: ir.Model, requested: int) -> None:
    """Raise :class:`UnsupportedOpsetError` when torch.onnx kept a higher opset than requested.

    torch.onnx writes opset 18 and converts down; when the converter fails it keeps 18 and only logs.
    """
    got = model.opset_imports.get("", requested)
    if got == requested:
        return
    needs: dict[str, int] = {}
    for graph in _graphs(model):
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if node.domain not in ("", "ai.onnx") or node.op_type in needs:
                continue
            try:
                onnx.defs.get_schema(node.op_type, max_inclusive_version=requested, domain="")
            except onnx.defs.SchemaError:
                with contextlib.suppress(onnx.defs.SchemaError):
                    first = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                                if s.name == node.op_type and s.domain == "")
                    needs[node.op_type] = first
    if needs:
        lowest = max(needs.values())
        ops = ", ".join(f"{op_type} (from opset {v})" for op_type, v in sorted(needs.items(), key=lambda kv: -kv[1]))
        detail = f"it uses {ops}, which opset {requested} does not have; the lowest opset it fits is {lowest}"
    else:
        detail = f"the ONNX version converter could not convert it from opset {got}"
    raise UnsupportedOpsetError(f"opset_version={requested} is lower than this graph needs: {detail}. Use "
                                f"opset_version >= {max(needs.values(), default=got)} (the default, "
                                f"{TORCHLIB_OPSET}, is what torch.onnx writes natively)")


def stamp_metadata(model: ir.Model, model_class: str) -> None:
    """Namespaced ``metadata_props``: ``pkg.hfexport.*``."""
    from importlib import metadata

    model.metadata_props["pkg.hfexport.backend"] = "onnx"
    model.metadata_props["pkg.hfexport.model_class"] = model_class
    with contextlib.suppress(metadata.PackageNotFoundError):
        model.metadata_props["pkg.hfexport.version"] = metadata.version("hfexport-onnx")


# Node metadata that torch.onnx writes and that names the exporting machine's files: the Python stack of each
# node's op, with absolute paths (the user's checkout, site-packages). Up to 88% of a quantized model.onnx's bytes.
MACHINE_METADATA: tuple[str, ...] = ("pkg.torch.onnx.stack_trace",)


def drop_machine_metadata(model: ir.Model) -> int:
    """Remove :data:`MACHINE_METADATA` from every node (main graph, subgraphs, functions); returns the nodes changed.

    An artifact is shipped to other machines: it should not carry the exporting machine's paths. The module
    hierarchy (``namespace``, ``pkg.torch.onnx.class_hierarchy``, ``name_scopes``) and the FX node stay, for
    debugging, as they name no file."""
    changed = 0
    for graph in _graphs(model):
        for node in ir.traversal.RecursiveGraphIterator(graph):
            found = [key for key in MACHINE_METADATA if key in node.metadata_props]
            for key in found:
                del node.metadata_props[key]
            changed += bool(found)
    return changed


def node_count(model: ir.Model) -> int:
    """Nodes in the main graph, its subgraphs and every function."""
    return sum(sum(1 for _ in ir.traversal.RecursiveGraphIterator(g)) for g in _graphs(model))
