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

import contextlib
import hashlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["SPILL_FROM_BYTES", "WEIGHTS_TAG", "external_weights", "named_data_on_disk", "release_lowered_modules",
           "shares_weights_with_portable_kernels"]

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


# ── Weights on disk while lowering (issue 44) ───────────────────────────────────────────────────────────
# A blob of named data at least this large goes to a file as it is added; smaller ones (scales, biases, norms) stay
# bytes: each file costs an open, a write and a hash.
SPILL_FROM_BYTES = 1 << 20


class _SpillDirectory:
    """A temporary directory of spilled blobs, removed when the last blob in it (and this object) is collected."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="hfexport-executorch-weights-"))
        self.count = 0
        weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    def spill(self, data: bytes | bytearray | memoryview) -> Any:
        """``data`` written to a new file of the directory: ExecuTorch's ``FileBackedData`` of it (its SHA-256 known,
        the file removed when the object goes), which holds the directory alive."""
        from executorch.exir._serialize._cord import FileBackedData

        self.count += 1
        path = self.path / f"{self.count:06d}.bin"
        with open(path, "wb") as file:
            file.write(data)
        blob = FileBackedData(os.fspath(path), cleanup=True, sha256=hashlib.sha256(data).digest())
        blob._hfexport_directory = self  # the directory outlives each of its files
        return blob


@contextlib.contextmanager
def named_data_on_disk(min_bytes: int | None = None) -> Iterator[None]:
    """While in the ``with`` body, every blob of ``min_bytes`` (default :data:`SPILL_FROM_BYTES`) or more that a backend adds to ExecuTorch's named data
    (``NamedDataStore.add_named_data``: XNNPACK's weights, as its preprocess serializes them in ``to_backend``), and
    each constant the emitter keeps for a ``.ptd`` (``external_constant_buffer``, before ``serialize_for_executorch``
    merges it), is written to a temporary file and held as ExecuTorch's ``FileBackedData``.

    **Why**: XNNPACK's preprocess copies every weight into ``bytes`` (``node_visitor.get_serialized_buffer_index``),
    which the lowered modules, the edge program's ``NamedDataStore`` and the program manager hold until the program
    is written: one more copy of the weights beside the model's from ``to_backend`` to the write (0.5 B: +1,885 MiB).
    ExecuTorch's ``Cord``, its ``NamedDataStore`` and its ``.pte``/``.ptd`` serializers take ``FileBackedData``
    (``exir/_serialize/_cord.py``, added for the CUDA backend's weights, ``backends/cuda/cuda_weight_collector.py``)
    and copy it to the written file in 8 MiB chunks; the XNNPACK backend does not spill by itself.
    **Upstream**: no option for it in ExecuTorch 1.5.1's XNNPACK partitioner or ``ExecutorchBackendConfig``.
    **Remove when**: XNNPACK's preprocess (or the NamedDataStore) keeps large blobs on disk itself.
    """
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.program import _program

    directory, min_bytes = _SpillDirectory(), SPILL_FROM_BYTES if min_bytes is None else min_bytes
    add_named_data, serialize = NamedDataStore.add_named_data, _program.serialize_for_executorch

    def spilled(data: Any) -> Any:
        return directory.spill(data) if isinstance(data, bytes | bytearray) and len(data) >= min_bytes else data

    def add_named_data_on_disk(self: Any, key: str, data: Any, *args: Any, **kwargs: Any) -> None:
        add_named_data(self, key, spilled(data), *args, **kwargs)

    def serialize_for_executorch(emitter_output: Any, *args: Any, **kwargs: Any) -> Any:
        constants = emitter_output.external_constant_buffer  # the .ptd's portable-kernel constants, as bytes
        constants[:] = [spilled(data) for data in constants]
        return serialize(emitter_output, *args, **kwargs)

    NamedDataStore.add_named_data = add_named_data_on_disk
    _program.serialize_for_executorch = serialize_for_executorch
    try:
        yield
    finally:
        NamedDataStore.add_named_data = add_named_data
        _program.serialize_for_executorch = serialize


def release_lowered_modules(edge: Any) -> int:
    """Let go of what ``edge``'s lowered modules (``LoweredBackendModule``) hold once ``to_executorch`` has serialized
    the program: each one's named data (the delegate's weights: bytes, or the spilled files), and the entries of
    torch's fake-tensor dispatch cache that hold a lowered module (of this export or an earlier one); returns the
    number of cache entries dropped.

    **Why**: ExecuTorch's fake runs of ``executorch_call_delegate`` pass the lowered module as an argument, and
    ``FakeTensorMode._prep_args_for_hash`` puts an argument it does not know into the cache key as the object itself:
    ``FakeTensorMode.cache``, a class attribute, then holds every lowered module for the life of the process, with
    its named data (the weights' bytes XNNPACK serialized: the size of the model, at each export) and the partition's
    program (the model's parameters). Measured: the 400 MB tied Llama's load step held its 286 MiB of named data.
    **Upstream**: none found (torch 2.15: ``torch/_subclasses/fake_tensor.py``, the ``else`` branch of
    ``_prep_args_for_hash``; ExecuTorch 1.5.1: ``exir/delegate.py``).
    **Remove when**: the fake-tensor cache keys unknown objects by id with a weak reference, or bypasses them.
    """
    from executorch.exir.lowered_backend_module import LoweredBackendModule, get_lowered_submodules
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name in getattr(edge, "methods", ()):
        for _, module, _ in get_lowered_submodules(edge.exported_program(name).graph_module):
            module._named_data_store_output = None
    cache = FakeTensorMode.cache
    held = [key for key in list(cache) if any(isinstance(v, LoweredBackendModule) for v in getattr(key, "key", ()))]
    for key in held:
        cache.pop(key, None)
    return len(held)
