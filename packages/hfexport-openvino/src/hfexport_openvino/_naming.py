"""The names of an OpenVINO model's inputs and outputs: one per flattened pytree leaf of the traced program
(``input_ids``, ``past_key_values.layers.0.keys``, ``last_hidden_state``), set on the model and kept in the
manifest's ``openvino`` section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hfexport.plugin import flatten_with_names

__all__ = ["io_names", "name_model_io"]


def _unique(name: str, taken: set[str], fallback: str) -> str:
    candidate = name if name and not name.replace(".", "").isdigit() else f"{fallback}_{name.replace('.', '_')}"
    suffix = 1
    unique = candidate
    while unique in taken:
        unique, suffix = f"{candidate}_{suffix}", suffix + 1
    taken.add(unique)
    return unique


def io_names(program: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``input_leaves`` and ``output_leaves``: a name per flattened leaf of ``program``'s user inputs and outputs,
    ``None`` where the leaf is not a tensor (baked into the program); ``output_constants``: ``{leaf index: value}``
    of the outputs that are constants; ``int_outputs``: the indices of the outputs that are Python ints computed
    from dynamic dims (SymInts: MaskFormer-Swin's spatial sizes), which the model returns as 0-d int64 tensors
    (``_graph.symint_outputs_as_tensors``)."""
    import torch
    import torch.utils._pytree as pytree
    from torch.export.graph_signature import ConstantArgument, SymIntArgument, TensorArgument

    signature = program.graph_signature
    taken: set[str] = set()
    user_inputs = [spec for spec in signature.input_specs if spec.kind.name == "USER_INPUT"]
    names, _, _ = flatten_with_names(dict(inputs))
    if len(names) != len(user_inputs):
        names = [getattr(spec.arg, "name", "") for spec in user_inputs]
    input_leaves = [_unique(name, taken, "input") if isinstance(spec.arg, TensorArgument) else None
                    for name, spec in zip(names, user_inputs, strict=True)]
    out_spec = program.call_spec.out_spec
    tree = pytree.tree_unflatten([torch.empty(0)] * out_spec.num_leaves, out_spec)
    out_names, _, _ = flatten_with_names(tree)
    user_outputs = [spec for spec in signature.output_specs if spec.kind.name == "USER_OUTPUT"]
    output_leaves: list[str | None] = []
    constants: dict[str, Any] = {}
    int_outputs: list[int] = []
    for index, (name, spec) in enumerate(zip(out_names, user_outputs, strict=True)):
        tensor = isinstance(spec.arg, TensorArgument | SymIntArgument)
        output_leaves.append(_unique(name, taken, "output") if tensor else None)
        if isinstance(spec.arg, SymIntArgument):
            int_outputs.append(index)
        elif not tensor:
            constants[str(index)] = spec.arg.value if isinstance(spec.arg, ConstantArgument) else None
    return {"input_leaves": input_leaves, "output_leaves": output_leaves, "output_constants": constants,
            "int_outputs": int_outputs}


def name_model_io(model: Any, inputs: list[str], outputs: list[str]) -> None:
    """Give ``model``'s (an ``openvino.Model``) inputs and outputs the names ``inputs`` and ``outputs``, in order.

    Raises:
        RuntimeError: the model has another number of inputs or outputs than names are given.
    """
    for kind, ports, wanted in (("inputs", model.inputs, inputs), ("outputs", model.outputs, outputs)):
        if len(ports) != len(wanted):
            raise RuntimeError(f"openvino.convert_model made a model with {len(ports)} {kind} for the program's "
                               f"{len(wanted)} tensor {kind} ({', '.join(wanted)})")
        for port, name in zip(ports, wanted, strict=True):
            port.get_tensor().set_names({name})
