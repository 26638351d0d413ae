"""Runtimes that take and return tensors by name (ONNX Runtime, OpenVINO): a readable name for every flattened
input and output leaf of the traced program (``input_ids``, ``cache.layers.0.keys``, ``logits``), written into the
program and into the manifest's backend section, and the runner's side of it (:class:`NamedIORunner`): the names
read back and checked against the runtime's, the named feed, and the flat outputs with constants and ints put
back.

Nothing here imports torch at import time, nor names a backend.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from ._artifact import FileRunner, flatten_with_names

__all__ = ["NamedIORunner", "io_names"]


def _readable(name: str, taken: set[str], default: str) -> str:
    """``name``, or ``default`` (``default_3`` for a bare index ``3``), made unique among ``taken`` (``_1``, ...)."""
    if not name or name.replace(".", "").isdigit():
        name = f"{default}_{name.replace('.', '_')}" if name else default
    base, i = name, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def io_names(program: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Readable names of ``program``'s (a ``torch.export.ExportedProgram``) user inputs and outputs, one per
    flattened leaf, ``None`` for a leaf that is not a tensor (baked into the program).

    Returns:
        the manifest section's ``input_leaves`` and ``output_leaves`` (a name or ``None`` per leaf),
        ``output_constants`` (``{leaf index: value}`` of the outputs that are constants) and ``int_outputs`` (the
        indices of the outputs that are Python ints computed from dynamic dims, SymInts: the runtime returns each
        as a 0-d int64 tensor and :class:`NamedIORunner` gives it back as an int; MaskFormer-Swin's spatial sizes).
    """
    import torch
    import torch.utils._pytree as pytree
    from torch.export.graph_signature import ConstantArgument, SymIntArgument, TensorArgument

    signature = program.graph_signature
    taken: set[str] = set()
    user_inputs = [spec for spec in signature.input_specs if spec.kind.name == "USER_INPUT"]
    names, _, _ = flatten_with_names(dict(inputs))
    if len(names) != len(user_inputs):  # cannot happen for a traced signature; keep torch's names then
        names = [getattr(spec.arg, "name", "") for spec in user_inputs]
    input_leaves = [_readable(name, taken, "input") if isinstance(spec.arg, TensorArgument) else None
                    for name, spec in zip(names, user_inputs, strict=True)]
    out_spec = program.call_spec.out_spec
    # Tensor placeholders, not ints: cache types flatten by walking their tensor-valued attributes.
    tree = pytree.tree_unflatten([torch.empty(0) for _ in range(out_spec.num_leaves)], out_spec)
    out_names, _, _ = flatten_with_names(tree)
    user_outputs = [spec for spec in signature.output_specs if spec.kind.name == "USER_OUTPUT"]
    output_leaves: list[str | None] = []
    constants: dict[str, Any] = {}
    int_outputs: list[int] = []
    for index, (name, spec) in enumerate(zip(out_names, user_outputs, strict=True)):
        if isinstance(spec.arg, TensorArgument | SymIntArgument):
            output_leaves.append(_readable(name, taken, "output"))  # a bare tensor output is called "output"
            if isinstance(spec.arg, SymIntArgument):
                int_outputs.append(index)
        else:
            output_leaves.append(None)
            constants[str(index)] = spec.arg.value if isinstance(spec.arg, ConstantArgument) else None
    return {"input_leaves": input_leaves, "output_leaves": output_leaves, "output_constants": constants,
            "int_outputs": int_outputs}


class NamedIORunner(FileRunner):
    """Base of the :class:`FileRunner` s whose runtime takes and returns tensors by name.

    The names are :meth:`io_names`'s, kept in the manifest's backend section and given to the runner as ``io``.
    A subclass calls :meth:`bind_io` in its ``open()`` with the names its runtime has, and in its ``run()`` feeds
    :meth:`named_inputs` and returns :meth:`flat_outputs` of what the runtime computed.

    Args:
        path: the program file.
        data_path: its weights file, if any.
        io: ``input_leaves`` (the runtime's input name of each flattened input leaf, ``None`` for a leaf baked into
            the program), ``output_leaves`` (the output name of each output leaf, ``None`` where
            ``output_constants`` gives its value) and ``int_outputs`` (given back as ints), and whatever else the
            backend keeps in its manifest section; kept as ``self.io``.

    Attributes:
        io_error: the exception :meth:`bind_io` raises for a named input the runtime lacks.
    """

    io_error: ClassVar[type[Exception]] = RuntimeError
    io_names = staticmethod(io_names)

    def __init__(self, path: str | os.PathLike[str], data_path: str | os.PathLike[str] | None = None, *,
                 io: Mapping[str, Any] | None = None):
        self.io = dict(io or {})
        super().__init__(path, data_path)

    def bind_io(self, inputs: Sequence[str], outputs: Sequence[str], accepted: Iterable[str] | None = None) -> None:
        """Read the leaves' names from ``self.io``, by default the runtime's own ``inputs`` and ``outputs`` (in
        order), and check that the runtime takes every named input leaf.

        Args:
            inputs, outputs: the runtime's input and output names.
            accepted: every name an input answers to, where the runtime knows one input by several (default
                ``inputs``).

        Raises:
            io_error: a named input leaf the runtime has no input of (names them and the runtime's inputs).
        """
        self.input_leaves: list[str | None] = list(self.io.get("input_leaves") or inputs)
        self.output_leaves: list[str | None] = list(self.io.get("output_leaves") or outputs)
        self.output_constants: dict[str, Any] = dict(self.io.get("output_constants") or {})
        self.int_outputs: set[int] = {int(i) for i in self.io.get("int_outputs") or ()}  # SymInts: 0-d int64
        missing = sorted({n for n in self.input_leaves if n is not None} - set(inputs if accepted is None else accepted))
        if missing:
            raise self.io_error(f"{self.path.name} has no inputs {missing}; its inputs are {list(inputs)}")

    def named_inputs(self, args: tuple[Any, ...], dtypes: Sequence[Any] = ()) -> dict[str, Any]:
        """The top-level inputs ``args`` (signature order; pytrees allowed) as ``{name: tensor}`` of the named leaves
        (:meth:`FileRunner.flat_inputs`: a floating leaf cast to ``dtypes[i]``).

        Raises:
            TypeError: ``args`` flatten to another number of leaves than the program has.
        """
        import torch

        leaves = self.flat_inputs(args, dtypes)
        if len(leaves) != len(self.input_leaves):
            raise TypeError(f"expected {len(self.input_leaves)} input tensors after flattening, got {len(leaves)}")
        return {name: torch.as_tensor(leaf) for name, leaf in zip(self.input_leaves, leaves, strict=True)
                if name is not None}

    def flat_outputs(self, values: Mapping[str, Any]) -> list[Any]:
        """The flat outputs, in the program's order, from the runtime's ``{name: tensor or numpy array}``: a
        constant leaf's value, an int output as an int, an array as a tensor sharing its memory."""
        import torch

        out = []
        for i, name in enumerate(self.output_leaves):
            if name is None:
                out.append(self.output_constants.get(str(i)))
            elif i in self.int_outputs:
                out.append(int(values[name]))
            else:
                value = values[name]
                out.append(value if isinstance(value, torch.Tensor) else torch.from_numpy(value))
        return out
