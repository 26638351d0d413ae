"""Weights stored once when a delegate and a portable kernel read the same one (tied input and output embeddings).

A tied embedding is one tensor read by two ops: ``aten.embedding``, which runs on a portable kernel (no delegate
takes it), and the LM head's ``linear``, which XNNPACK takes. ExecuTorch keeps the two copies apart: the portable
kernel's constant in the program's constant segment, the delegate's in its named data, so a ``.pte`` holds the
tensor twice (Qwen2-0.5B-shaped: 2,521 MB for 1,976 MB of weights, 1.28x; the 151,936 x 896 table is 545 MB).

Such a program keeps its weights outside the ``.pte``, in one ``model.ptd`` (ExecuTorch's external constants:
``ExecutorchBackendConfig.external_constants`` for the portable kernels' constants, the ``delegate_constant_tag``
of ``node.meta["custom"]`` for the delegates'). The two go through one ``NamedDataStore`` when the program is
serialized, which stores equal bytes once (by SHA-256), so the tied tensor is written once. The runtime loads the
pair (``Runtime.load_program(pte, data_path=ptd)``); the artifact lists both files. Programs without a shared weight
keep everything in ``model.pte``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["WEIGHTS_TAG", "external_weights", "shares_weights_with_portable_kernels"]

WEIGHTS_TAG = "model"  # the data file's name: model.ptd


def _constant_placeholders(program: Any) -> dict[str, str]:
    """Placeholder name -> state name of the program's parameters, buffers it does not mutate, and constants."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    names = dict(signature.inputs_to_parameters)
    names.update({p: b for p, b in signature.inputs_to_buffers.items() if b not in mutated})
    names.update(signature.inputs_to_lifted_tensor_constants)
    return names


def shares_weights_with_portable_kernels(program: Any) -> bool:
    """Whether a weight read by ``aten.embedding`` is also read by another op (a tied LM head)."""
    constants = _constant_placeholders(program)
    for node in program.graph_module.graph.nodes:
        if node.op != "placeholder" or node.name not in constants:
            continue
        targets = {user.target for user in node.users}
        if torch.ops.aten.embedding.default in targets and len(targets) > 1:
            return True
    return False


def external_weights(program: Any) -> Callable[[torch.fx.Node], str | None]:
    """Tag ``program``'s constant placeholders for the delegates' named data in ``model.ptd``; returns the
    ``ExecutorchBackendConfig.external_constants`` callable that sends the portable kernels' constants there too
    (mutated buffers stay in planned memory)."""
    constants = _constant_placeholders(program)
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder" and node.name in constants:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = WEIGHTS_TAG
    return _weights_tag


def _weights_tag(node: torch.fx.Node) -> str | None:
    spec = node.meta.get("spec")
    if getattr(spec, "mem_id", None) is not None:  # memory planned: a buffer the program writes
        return None
    return WEIGHTS_TAG
