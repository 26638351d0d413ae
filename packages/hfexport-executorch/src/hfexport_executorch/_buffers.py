"""Buffers that a program mutates, and their initial values (for ``_patch_mutable_buffer_initial_state``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["mutated_buffer_initial_value"]


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
