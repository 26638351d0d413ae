"""Buffers that a program mutates: their initial values (for ``_patch_mutable_buffer_initial_state``), and whether
ExecuTorch's re-inplace pass may write them in place."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["index_puts_reinplaceable", "mutated_buffer_initial_value"]


def mutated_buffer_initial_value(program: Any, placeholder: str) -> torch.Tensor | None:
    """The value at export time of the buffer behind ``placeholder`` when the program mutates it, else None.

    Looks in ``state_dict`` (persistent buffers), then ``constants`` (non-persistent ones), then
    ``named_buffers()``, the order ExecuTorch's emitter uses.
    """
    signature = program.graph_signature
    name = signature.inputs_to_buffers.get(placeholder) if isinstance(placeholder, str) else None
    if name is None or name not in signature.buffers_to_mutate.values():
        return None
    for table in (program.state_dict, program.constants):
        if name in table and isinstance(table[name], torch.Tensor):
            return table[name]
    return next((b for n, b in program.named_buffers() if n == name), None)


def index_puts_reinplaceable(program: Any) -> bool:
    """Whether ExecuTorch's re-inplace pass may run on ``program``: it writes a mutable buffer with ``index_put``,
    and every such write fits the only form ExecuTorch's in-place ``index_put_`` kernel runs: one 1-D index tensor
    (the other indices ``None``) and values of the buffer's rank whose size at the indexed dim is the index's length
    (op_index_put.cpp: "Special case in-place index_put only supports 1-dimensional index tensors"). Any other write
    (the field case s34's ``cache[:, :, positions, :]`` with values of another rank) makes the re-inplaced program
    fail at run time, so the pass is then left off. The lowered program's signature is read: the traced one lists
    no mutated buffer of a task's wrapper module."""
    signature = program.graph_signature
    mutable = {placeholder for placeholder, buffer in signature.inputs_to_buffers.items()
               if buffer in signature.buffers_to_mutate.values()}
    writes = [n for n in program.graph.nodes if n.op == "call_function" and "index_put" in str(n.target)
              and n.args and getattr(n.args[0], "op", None) == "placeholder" and n.args[0].target in mutable]
    for node in writes:
        base, indices, values = node.args[0].meta.get("val"), node.args[1], node.args[2].meta.get("val")
        given = [(dim, index) for dim, index in enumerate(indices) if index is not None]
        if base is None or values is None or len(given) != 1 or values.dim() != base.dim():
            return False
        dim, index = given[0]
        index_value = index.meta.get("val")
        if index_value is None or index_value.dim() != 1 or values.shape[dim] != index_value.shape[0]:
            return False
    return bool(writes)
