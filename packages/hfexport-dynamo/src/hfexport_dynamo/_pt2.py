"""Reading a ``.pt2`` as untrusted input: hfexport reads the archive, and torch builds the program from what
hfexport parsed. torch never opens the file.

Measured in torch 2.15 (``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``), its own
``torch.export.load`` can run code from a file: it unpickles sample inputs with ``weights_only=True`` and, when
that fails, again with ``weights_only=False``; pickled weights and constants with ``weights_only=False``;
``custom_obj_*`` through the TorchScript unpickler and ``opaque_obj_*`` through ``pickle.loads``; it parses shape
expressions with ``sympy.sympify`` (``eval``), and ``program.module()`` ``exec``-s ``guards_code``. Its zip reader
matches names case-insensitively and takes any member under ``models/`` as a program. So :func:`read_pt2`:

- reads the zip once, with ``zipfile``: every member stored (not compressed), in the layout ``torch.export.save``
  writes (:data:`hfexport_dynamo._pt2_archive._LAYOUT`) below one root folder, no name twice (nor twice up to
  case), sizes that fit the file, each member used exactly once (CRC-checked on read);
- builds weights and constants from their raw bytes (``torch.frombuffer``, ``as_strided`` bounds-checked); a
  pickled weight or constant, a TorchScript or opaque object is refused;
- unpickles the sample inputs with :class:`~hfexport_dynamo._pt2_archive.RestrictedUnpickler` (an allow-list
  ``find_class``, torch's storages read from the same archive, no ``BUILD``/``INST``/``OBJ``/``NEWOBJ``/extension
  opcodes), never ``torch.load``;
- reads the program JSON with bounds (:func:`hfexport.trust.parse_json`), parses every shape expression with its
  own small grammar into sympy objects (:func:`hfexport_dynamo._pt2_program.parse_sym_expr`: size symbols,
  integers below 2**64, ``+ - * / // %``, comparisons, ``Min``/``Max`` and torch's size functions, a bounded
  ``Pow``; torch's ``sympify`` then returns them as they are: nothing is parsed or evaluated from text), drops
  ``guards_code`` (hfexport checks inputs against the manifest itself) and every node's metadata (stack traces
  reach the code torch.fx generates), refuses a name with characters a name has not, a node target that is not an
  operator (:func:`~hfexport_dynamo._pt2_program.safe_target`) and a pytree spec outside the allow-list
  (:func:`hfexport.trust.load_treespec`);
- and hands those objects to torch's ``ExportedProgramDeserializer``.

``trust_remote_code=True`` hands the file to ``torch.export.load`` instead (what it runs is then the caller's
choice).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hfexport import UntrustedArtifactError
from hfexport.trust import import_type_modules, parse_json, unregistered

from ._pytree import register_transformers_pytrees

__all__ = ["admit_types", "allowed_type_module", "load_program", "mutated_buffer_names", "own_mutated_buffers",
           "read_pt2", "runnable_module", "save_program"]

logger = logging.getLogger("hfexport")


# ── the pytree types a saved program or manifest names: an allow-list, never an import by a given name ───────
_TRANSFORMERS_MODULE = re.compile(r"transformers\.(modeling_outputs|cache_utils|models\.[a-z0-9_]{1,64}\.modeling_"
                                  r"[a-z0-9_]{1,64})")


def allowed_type_module(module: str) -> bool:
    """Modules whose types an artifact may name and hfexport imports to register them: transformers'
    ``modeling_outputs``, ``cache_utils`` and ``models.<name>.modeling_<name>`` (their ``ModelOutput`` classes
    register themselves on import; importing one is what transformers' own auto classes do for a config's
    ``model_type``). Nothing else: another module must be imported by the caller first."""
    return bool(_TRANSFORMERS_MODULE.fullmatch(module))


def admit_types(types: set[str], enum_modules: set[str] = frozenset(), *,  # type: ignore[assignment]
                trust_remote_code: bool = False) -> list[str]:
    """Register the pytree types in ``types`` that the allow-list admits; return those still unregistered.

    Transformers' caches are registered (:func:`register_transformers_pytrees`), and a ``ModelOutput`` name's
    module is imported when :func:`allowed_type_module` admits it. With ``trust_remote_code`` the module of any
    other name (and of an enum) is imported too. Without it, enum modules are never imported: the spec reader
    refuses contexts that name them.
    """
    if any(t.startswith("transformers.") for t in types):
        register_transformers_pytrees()
    allowed = None if trust_remote_code else allowed_type_module
    import_type_modules(unregistered(types), allowed=allowed)
    if trust_remote_code:
        import importlib

        for module in sorted(m for m in enum_modules if m not in sys.modules):
            try:
                importlib.import_module(module)
            except ImportError:
                pass  # reading the spec fails with torch's message
    return unregistered(types)


# ── reading, writing and loading a .pt2 ───────────────────────────────────────────────────────────────────
def read_pt2(file: str | Path, data: bytes | bytearray | None = None) -> torch.export.ExportedProgram:
    """The ``ExportedProgram`` of a ``.pt2``, read as untrusted input (see the module docstring): hfexport's zip
    reader, raw weights, a restricted unpickler, a checked and canonical program JSON without guards, then torch's
    deserializer on those objects.

    The weights are built on the archive's bytes, not copied (``data`` when it is a ``bytearray``; else the file
    read once into one): loading holds one copy of the weights (issue 44).

    Raises:
        hfexport.UntrustedArtifactError: it holds what would run code (a pickle beyond tensors, an expression
            outside the grammar, a target that is not an operator, a pytree type outside the allow-list).
        ValueError: not a ``.pt2`` in the layout torch writes, or damaged (names the member).
    """
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass
    from torch.export.pt2_archive.constants import ARCHIVE_FORMAT_VALUE, ARCHIVE_VERSION_VALUE

    from ._pt2_archive import _LAYOUT, _PT2_FIXED, BufferFile, _Members, _payloads, unpickle_sample_inputs
    from ._pt2_program import _check_program

    file = Path(file)
    what = file.name
    if data is None:  # one read into one buffer, which the weights are then built on
        with open(file, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            del data[f.readinto(data) or 0:]
    elif not isinstance(data, bytearray):
        data = bytearray(data)  # a writable copy (torch's tensors are writable): pass a bytearray to avoid it
    size = len(data)
    with BufferFile(data) as stream:
        members = _Members(stream, what, _PT2_FIXED, _LAYOUT, size)
        fixed = {record: members.read(record) for record in _PT2_FIXED if record in members.records}
        if fixed.get("archive_format", b"").decode(errors="replace") != ARCHIVE_FORMAT_VALUE \
                or fixed.get("archive_version", b"").decode(errors="replace") != str(ARCHIVE_VERSION_VALUE):
            raise ValueError(f"{what} is not a .pt2 of archive version {ARCHIVE_VERSION_VALUE} (it records "
                             f"{fixed.get('archive_format')!r:.20}, {fixed.get('archive_version')!r:.20})")
        if fixed.get("byteorder", b"little") != sys.byteorder.encode():
            raise ValueError(f"{what} is {fixed.get('byteorder')!r:.20}-endian; this machine is {sys.byteorder}")
        models = [r for r in members.records if r.startswith("models/")]
        if len(models) != 1:
            raise ValueError(f"{what} holds {len(models)} programs; an hfexport .pt2 holds one")
        model = models[0][len("models/"):-len(".json")]
        program = parse_json(members.read(models[0]), max_depth=256)
        if not isinstance(program, dict):
            raise ValueError(f"{what}: models/{model}.json is not an object")
        program["guards_code"] = []  # exec-ed by program.module(); hfexport checks inputs against the manifest
        _check_program(program, what, {})
        state_dict = _payloads(members, f"data/weights/{model}_weights_config.json", "data/weights/", "weight_", what)
        constants = _payloads(members, f"data/constants/{model}_constants_config.json", "data/constants/",
                              "tensor_", what)
        sample = f"data/sample_inputs/{model}.pt"
        example_inputs = unpickle_sample_inputs(members.read(sample), f"{what}: {sample}") \
            if sample in members.records else ((), {})
        if members.unused():
            raise ValueError(f"{what}: members the program does not use: {members.unused()[:8]}")
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, program)
        return ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, example_inputs)
    except UntrustedArtifactError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch's deserializer raises many kinds on a malformed program
        raise ValueError(f"torch cannot build the program of {what} ({type(exc).__name__}: {exc}); it was written "
                         "by another torch version, or is damaged") from exc


class _FailSoftWriter(io.RawIOBase):
    """The file object ``torch.export.save`` writes to: the first failed write (a full disk) is kept, and later
    writes are counted and dropped, so torch's C++ archive writer never sees a write fail (it aborts the
    interpreter when one does: SIGABRT from ``PyTorchStreamWriter``'s destructor, measured in torch 2.15)."""

    def __init__(self, stream: Any):
        super().__init__()
        self.stream = stream
        self.error: OSError | None = None
        self.written = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:  # torch warns ("Expect archive file to be a file ending in .pt2") otherwise
        return True

    def write(self, data: Any) -> int:
        size = len(memoryview(data).cast("B"))
        if self.error is None:
            try:
                self.stream.write(data)
            except OSError as exc:
                self.error = exc
        self.written += size
        return size

    def seek(self, offset: int, whence: int = 0) -> int:  # torch seeks to 0 after writing; nothing to re-read
        return 0


@contextlib.contextmanager
def _without_stack_traces(program: torch.export.ExportedProgram) -> Iterator[None]:
    """The program's nodes without their ``stack_trace`` meta (the Python stack of each op, absolute paths of the
    exporting machine's checkout and site-packages) while the body runs; restored afterwards."""
    kept = []
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if "stack_trace" in node.meta:
                    kept.append((node, node.meta.pop("stack_trace")))
    try:
        yield
    finally:
        for node, trace in kept:
            node.meta["stack_trace"] = trace


def _raw_payloads(program: torch.export.ExportedProgram) -> bool:
    """Whether every weight and constant of ``program`` is a plain tensor, which torch writes as its raw bytes (a
    tensor subclass is pickled, a script or opaque object too: :func:`save_program` leaves those to torch)."""
    from torch.export.pt2_archive._package import _should_use_pickle

    return all(isinstance(value, torch.Tensor) and not _should_use_pickle(value)
               for value in (*program.state_dict.values(), *program.constants.values()))


def _write_payloads(writer: Any, tensors: dict[str, torch.Tensor], directory: str, prefix: str) -> Any:
    """Write ``tensors`` as torch's ``_package_state_dict`` / ``_package_constants`` write plain tensors (one member
    per storage and dtype, the whole storage's bytes; the same config), each storage handed to the archive writer
    as it is: torch copies each into ``bytes`` twice on the way (its ``_get_raw_tensor_bytes``, then pybind's
    ``bytes`` argument), a transient of twice the largest tensor (issue 44: 0.49x the weights of a Llama
    whose embedding is a quarter of them). A storage off the CPU is copied there, one at a time."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import serialize_tensor_meta
    from torch._subclasses.fake_tensor import is_fake_tensor
    from torch.export.pt2_archive._package_weights import TensorProperties, Weights, group_weights

    config = {}
    index = writer.count_prefix(f"{directory}{prefix}")
    for group in group_weights({"model": Weights({name: (t, TensorProperties(t)) for name, t in tensors.items()})}):
        path_name = f"{prefix}{index}"
        index += 1
        first = tensors[next(iter(group))[1]]
        if is_fake_tensor(first) or not first.data_ptr():  # torch writes no bytes for these either
            writer.write_bytes(f"{directory}{path_name}", b"")
        else:
            storage = first.untyped_storage()
            storage = storage if storage.device.type == "cpu" else storage.cpu()
            writer.archive_file.write_record(f"{directory}{path_name}", storage, storage.nbytes())
        for _, name in group:
            config[name] = schema.PayloadMeta(path_name=path_name, is_param=isinstance(tensors[name], torch.nn.Parameter),
                                              use_pickle=False, tensor_meta=serialize_tensor_meta(tensors[name]))
    return schema.PayloadConfig(config=config)


def _write_pt2(program: torch.export.ExportedProgram, sink: Any) -> None:
    """``torch.export.save(program, sink)``, member for member (the layout, names, configs and bytes torch writes;
    tested against it), with each weight and constant written from its storage without a copy
    (:func:`_write_payloads`). A program with a pickled payload goes through ``torch.export.save`` itself."""
    if not _raw_payloads(program):
        torch.export.save(program, sink)
        return
    from torch._export.serde.serialize import serialize
    from torch.export.pt2_archive._package import PT2ArchiveWriter, _package_payload_config
    from torch.export.pt2_archive.constants import (
        CONSTANTS_CONFIG_FILENAME_FORMAT,
        CONSTANTS_DIR,
        MODELS_FILENAME_FORMAT,
        SAMPLE_INPUTS_FILENAME_FORMAT,
        TENSOR_CONSTANT_FILENAME_PREFIX,
        WEIGHT_FILENAME_PREFIX,
        WEIGHTS_CONFIG_FILENAME_FORMAT,
        WEIGHTS_DIR,
    )

    name = "model"  # torch.export.save's name for its one program
    with PT2ArchiveWriter(sink) as writer:
        weights = _write_payloads(writer, dict(program.state_dict), WEIGHTS_DIR, WEIGHT_FILENAME_PREFIX)
        _package_payload_config(writer, weights, WEIGHTS_CONFIG_FILENAME_FORMAT.format(name))
        constants = _write_payloads(writer, dict(program.constants), CONSTANTS_DIR, TENSOR_CONSTANT_FILENAME_PREFIX)
        _package_payload_config(writer, constants, CONSTANTS_CONFIG_FILENAME_FORMAT.format(name))
        artifact = serialize(program, serialize_state_dict=False, serialize_constants=False)
        writer.write_bytes(MODELS_FILENAME_FORMAT.format(name), artifact.exported_program)
        writer.write_bytes(SAMPLE_INPUTS_FILENAME_FORMAT.format(name), artifact.example_inputs)


def save_program(program: torch.export.ExportedProgram, file: str | Path) -> None:
    """``torch.export.save(program, file)`` that raises a failed write (``OSError``, ``ENOSPC`` on a full disk)
    instead of letting torch's writer abort the interpreter. The file carries no node's Python stack: an artifact
    travels to other machines and should not name the exporting machine's files (the program in memory keeps them).
    Each weight is written from its tensor's storage, with no copy of it (:func:`_write_pt2`).

    Raises:
        OSError: a write failed (the file is left partial: the caller's save removes its staging directory).
    """
    with open(file, "wb") as stream, _without_stack_traces(program):
        sink = _FailSoftWriter(stream)
        _write_pt2(program, sink)
        if sink.error is not None:
            raise sink.error
        stream.flush()


def load_program(file: str | Path, *, trust_remote_code: bool = False, data: bytes | bytearray | None = None
                 ) -> torch.export.ExportedProgram:
    """The program of a ``.pt2``: :func:`read_pt2` (nothing from the file runs), or ``torch.export.load(file)``
    with ``trust_remote_code`` (the caller trusts the file: torch may unpickle anything in it).

    Args:
        file: the ``.pt2`` (its name names it in messages when ``data`` is given).
        data: the file's bytes as they were checked (``hfexport.trust.artifact_bytes``): read from memory, the
            path is not opened again; a ``bytearray`` is used in place (the weights are built on it).

    Raises:
        hfexport.UntrustedArtifactError: what would run, and how to opt in.
        ValueError: not a ``.pt2`` archive, or torch cannot read it.
    """
    file = Path(file)
    if not trust_remote_code:
        return read_pt2(file, data=data)
    logger.warning("loading %s with trust_remote_code=True: torch.export.load may unpickle anything in it", file)
    try:
        return torch.export.load(io.BytesIO(data) if data is not None else file)
    except Exception as exc:
        raise ValueError(f"torch.export.load cannot read {file} ({type(exc).__name__}: {exc}); it was written by "
                         "another torch version, or is damaged") from exc


# ── mutated buffers ──────────────────────────────────────────────────────────────────────────────────
# Buffers a program mutates: the program owns their export-time value, and a runner runs on copies of it.
#
# ``torch.export`` keeps the model's own buffer tensors in ``ExportedProgram.state_dict`` / ``constants``, and
# ``program.module()`` registers those same tensors. For a buffer that ``forward`` mutates in place (a pre-filled
# cache, running statistics) that means three silent losses of its initial value: running the export mutates the
# user's model, running the model eagerly after export changes what the export starts from, and saving after a run
# writes the mutated state as the initial value. ExecuTorch serializes the initial value and each loaded program
# starts from it; these helpers give the ``dynamo`` backend the same contract.


def mutated_buffer_names(program: torch.export.ExportedProgram) -> list[str]:
    """The fully qualified names of the buffers ``program`` may mutate: every buffer. ``torch.export.export``'s
    training IR keeps in-place ops in the graph (``buffers_to_mutate`` is then empty), and a mutation may reach a
    buffer through views, so every buffer counts (parameters and lifted constants do not)."""
    return sorted(set(program.graph_signature.inputs_to_buffers.values())
                  | set(program.graph_signature.buffers_to_mutate.values()))


def own_mutated_buffers(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Replace, in place, each mutated buffer of ``program`` by a copy: later changes of the model's tensor (an
    eager call) no longer change the program's initial value, and the program's runs no longer change the model."""
    for name in mutated_buffer_names(program):
        for table in (program.state_dict, program.constants):
            if isinstance(table.get(name), torch.Tensor):
                table[name] = table[name].detach().clone()
    return program


def runnable_module(program: torch.export.ExportedProgram) -> Any:
    """``program.module()`` whose buffers are copies: its calls carry the state from call to call without touching
    the program, so a save after a run still writes the initial value."""
    module = program.module()
    for name in mutated_buffer_names(program):
        owner_path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        if isinstance(getattr(owner, leaf, None), torch.Tensor):
            setattr(owner, leaf, getattr(owner, leaf).detach().clone())
    return module
