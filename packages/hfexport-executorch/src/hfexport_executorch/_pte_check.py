"""Reading a ``.pte`` (and its ``.ptd``) before the ExecuTorch runtime does: what the runtime would act on without a
check of its own is checked here, and a file that fails is an ``IntegrityError`` naming it.

The runtime verifies the program's flatbuffer (``Program::Verification::InternalConsistency``) and the XNNPACK
delegate verifies its own flatbuffer, but neither checks what the values mean. Measured on executorch 1.5.1 with
byte mutations of a saved ``.pte`` (hashes rewritten, as an attacker would), the interpreter died in two ways:

- **SIGSEGV in XNNPACK** (``xnn_create_fully_connected_nc_f32`` under ``XNNCompiler::compileModel``): a weight's
  dims raised to ``[4, 4915216]`` while its data stayed 256 bytes; XNNPACK packs the weight from the data pointer
  and reads past it. Nothing in the delegate compares a constant's size with the tensor it backs.
- **SIGABRT from a log line**: the runtime's log messages print strings from the file (``Backend %s is not
  registered``, ``Failed to get constant data for key %s``, the XNNPACK identifier ``'%.4s'``); the Python
  binding redirects the C++ streams into ``sys.stderr`` (pybind11 ``scoped_estream_redirect``), which decodes
  strictly as UTF-8, and the ``UnicodeDecodeError`` thrown inside a ``noexcept`` logging path calls
  ``std::terminate``.

So the file is read here with ExecuTorch's own schemas (the ``.fbs`` files installed with it, the runtime's
version) by a bounded reader in Python, and refused unless:

- every string the runtime can print (method names, operator names and overloads, backend ids, compile-spec keys,
  named-data keys, tensor names, XNNPACK constant keys) is printable ASCII;
- every delegate is XNNPACK (``CudaBackend`` loads an AOTInductor shared library from the artifact: native code,
  only with ``trust_remote_code=True``), and every XNNPACK payload's header, identifier and regions fit;
- in each XNNPACK graph: every tensor has ``num_dims == len(dims) <= 6`` and a bounded element count; every id a
  node, input or output names is a value the graph defines; a list beside a ``num_dims`` has that length; each
  constant's index is in range and its data (inline, in the program's named data, or in the ``.ptd``) holds at
  least ``numel x element size`` bytes; per-channel scales match their channel count.

What is not checked: the meaning of a node's scalar parameters (kernel sizes, strides, axes) beyond what XNNPACK's
``xnn_define_*`` functions validate themselves, and the portable kernels' own argument checks (which return
errors). ``tests/executorch/test_executorch_untrusted.py`` crafts one ``.pte`` per refused kind; the fuzz probe
(``tests/core/test_untrusted_fuzz.py``) mutates saved files at random.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from functools import cache
from pathlib import Path
from typing import Any

from hfexport import IntegrityError

__all__ = ["check_pte"]

_SCALARS = {"bool": "B", "byte": "b", "ubyte": "B", "int8": "b", "uint8": "B", "short": "h", "ushort": "H",
            "int16": "h", "uint16": "H", "int": "i", "uint": "I", "int32": "i", "uint32": "I", "long": "q",
            "ulong": "Q", "int64": "q", "uint64": "Q", "float": "f", "float32": "f", "double": "d", "float64": "d"}
_MAX_STRING = 4096
_MAX_DIMS = 6  # XNN_MAX_TENSOR_DIMS
_MAX_NUMEL = 1 << 40
_INVALID_ID = 0xFFFFFFFF  # XNN_INVALID_VALUE_ID: an optional input (a bias) that is absent
_PRINTABLE = re.compile(rb"[\x20-\x7e]*")
# bits per element of XNNDatatype values (schema.fbs); absent: refused as a constant's type
_XNN_BITS = {1: 32, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8, 7: 32, 8: 4, 9: 8, 10: 4, 11: 8, 12: 32, 13: 32, 14: 16}


class _Bad(Exception):
    """Something in the file does not fit; the message says what (turned into an IntegrityError)."""


class _TooLarge(_Bad):
    """The program plans more memory than its size allows; the message is the whole refusal."""


# ── the schemas: ExecuTorch's own .fbs files, read once ──

@cache
def _schema(*relative: str) -> dict[str, Any]:
    """``{"tables": {name: [(field, type), ...] in slot order}, "unions": {name: [(member, type), ...]},
    "enums": {name: scalar type}}`` of the installed ExecuTorch's schema files (``include``s followed)."""
    import executorch.runtime

    root = Path(executorch.runtime.__file__).parent.parent  # beside the runtime that will read the file
    tables: dict[str, list[tuple[str, str]]] = {}
    unions: dict[str, list[str]] = {}
    enums: dict[str, str] = {}
    for rel in relative:
        text = re.sub(r"//[^\n]*", "", (root / rel).read_text())
        for kind, name, base, body in re.findall(r"\b(table|union|enum|struct)\s+(\w+)\s*(?::\s*(\w+))?\s*\{(.*?)\}",
                                                 text, re.S):
            if kind == "table":
                fields = []
                for line in body.split(";"):
                    match = re.match(r"\s*(\w+)\s*:\s*([\w.\[\]]+)", line)
                    if match:  # a type named with its namespace (executorch_flatbuffer.ScalarType) by its name
                        kind = match[2]
                        inner = kind.strip("[]").split(".")[-1]
                        fields.append((match[1], f"[{inner}]" if kind.startswith("[") else inner))
                tables[name] = fields
            elif kind == "union":
                unions[name] = [(m.split(":")[0].strip(), m.split(":")[-1].strip()) for m in body.split(",")
                                if m.strip()]
            elif kind == "enum":
                enums[name] = base
            else:  # none in ExecuTorch 1.5.1's schemas
                raise NotImplementedError(f"{rel} declares struct {name}: check_pte's reader reads tables only")
    return {"tables": tables, "unions": unions, "enums": enums}


def _program_schema() -> dict[str, Any]:
    return _schema("schema/scalar_type.fbs", "schema/program.fbs")


def _xnnpack_schema() -> dict[str, Any]:
    return _schema("backends/xnnpack/serialization/schema.fbs")


def _flat_tensor_schema() -> dict[str, Any]:
    return _schema("extension/flat_tensor/serialize/scalar_type.fbs", "extension/flat_tensor/serialize/flat_tensor.fbs")


# ── a bounded flatbuffer reader: every offset is checked against the buffer, nothing is trusted ──

class _Table:
    """One flatbuffer table at ``pos`` of ``buf``, read by field name through ``schema``."""

    def __init__(self, buf: memoryview, pos: int, schema: dict[str, Any], name: str, member: str | None = None):
        self.buf, self.pos, self.schema, self.name = buf, pos, schema, name
        self.member = member or name  # a union member's name (XNNConcatenate3 for a _XNNCat)
        vtable = pos - self._unpack("i", pos)
        self.vtable_size = self._unpack("H", vtable) if 0 <= vtable else 0
        if vtable < 0 or self.vtable_size < 4 or self.vtable_size % 2:
            raise _Bad(f"{name}: a vtable at {vtable}")
        self.vtable = vtable
        self._unpack("H", vtable + self.vtable_size - 2)
        self.slots: dict[str, tuple[int, str]] = {}
        slot = 0
        for field, kind in schema["tables"][name]:
            if kind in schema["unions"]:
                self.slots[field + "_type"] = (slot, "ubyte")
                slot += 1
            self.slots[field] = (slot, kind)
            slot += 1

    def _unpack(self, fmt: str, at: int) -> Any:
        size = struct.calcsize("<" + fmt)
        if at < 0 or at + size > len(self.buf):
            raise _Bad(f"{self.name}: a {size}-byte read at {at} outside {len(self.buf)} bytes")
        return struct.unpack_from("<" + fmt, self.buf, at)[0]

    def _field_at(self, field: str) -> tuple[int | None, str]:
        slot, kind = self.slots[field]
        entry = 4 + 2 * slot
        offset = self._unpack("H", self.vtable + entry) if entry < self.vtable_size else 0
        return (self.pos + offset if offset else None), kind

    def _kind(self, kind: str) -> str:
        return self.schema["enums"].get(kind, kind)

    def __getitem__(self, field: str) -> Any:
        at, kind = self._field_at(field)
        kind = self._kind(kind)
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind], at) if at is not None else 0
        if at is None:
            if kind in self.schema["unions"] and self[field + "_type"]:
                raise _Bad(f"{self.name}.{field}: a union member without its table")
            return None
        target = at + self._unpack("I", at)
        if kind == "string":
            return self._string(target)
        if kind.startswith("["):
            return self._vector(target, self._kind(kind[1:-1]))
        if kind in self.schema["unions"]:
            index = self[field + "_type"]
            members = self.schema["unions"][kind]
            if not 1 <= index <= len(members):
                raise _Bad(f"{self.name}.{field}: union member {index} of {len(members)}")
            member, table = members[index - 1]
            return _Table(self.buf, target, self.schema, table, member)
        return _Table(self.buf, target, self.schema, kind)

    def _string(self, at: int) -> bytes:
        length = self._unpack("I", at)
        if length > _MAX_STRING or at + 4 + length > len(self.buf):
            raise _Bad(f"{self.name}: a string of {length} bytes at {at}")
        return bytes(self.buf[at + 4: at + 4 + length])

    def _vector(self, at: int, kind: str) -> Any:
        length = self._unpack("I", at)
        start = at + 4
        if kind in _SCALARS:
            size = struct.calcsize(_SCALARS[kind])
            if start + length * size > len(self.buf):
                raise _Bad(f"{self.name}: a vector of {length} x {size} bytes at {at} outside {len(self.buf)} bytes")
            if kind in ("ubyte", "uint8", "byte", "int8"):
                return (start, length)  # bytes: where they lie, not a copy
            return list(struct.unpack_from(f"<{length}{_SCALARS[kind]}", self.buf, start))
        if start + 4 * length > len(self.buf):
            raise _Bad(f"{self.name}: a vector of {length} offsets at {at} outside {len(self.buf)} bytes")
        items = []
        for i in range(length):
            slot = start + 4 * i
            target = slot + self._unpack("I", slot)
            items.append(self._string(target) if kind == "string" else _Table(self.buf, target, self.schema, kind))
        return items


def _root(buf: memoryview, schema: dict[str, Any], name: str) -> _Table:
    if len(buf) < 8:
        raise _Bad(f"{len(buf)} bytes, shorter than a flatbuffer")
    return _Table(buf, struct.unpack_from("<I", buf, 0)[0], schema, name)


def _printable(text: bytes | None, what: str) -> None:
    if text is not None and not _PRINTABLE.fullmatch(text):
        raise _Bad(f"{what} {text[:80]!r} is not printable ASCII (the runtime prints it; a non-UTF-8 byte in a log "
                   "line aborts the interpreter)")


# ── the checks ──

def check_pte(path: Path, data_path: Path | None = None, *, trust_remote_code: bool = False,
              data: bytes | None = None, data_fd: int | None = None) -> None:
    """Read ``path`` (a ``.pte``) and ``data_path`` (its ``.ptd``, if any) with ExecuTorch's schemas, and refuse
    what the runtime would act on unchecked (see the module docstring for the list). ``data``: the ``.pte``'s bytes
    the runtime gets; ``data_fd``: the ``.ptd`` open, the file the runtime maps (``data_path`` then only names it).

    Raises:
        hfexport.IntegrityError: names the file and what does not fit.
    """
    files = [path.name] + ([data_path.name] if data_path is not None else [])
    try:
        named_sizes = _ptd_named_sizes(data_path, data_fd) if data_path is not None else {}
    except (_Bad, KeyError) as exc:
        raise _integrity(data_path, exc, files) from None
    data_bytes = (os.fstat(data_fd).st_size if data_fd is not None else
                  data_path.stat().st_size if data_path is not None else 0)
    try:
        if data is not None and len(data) < 48:
            raise _Bad(f"{len(data)} bytes, shorter than its headers")
        program = memoryview(data) if data is not None else _mapped(path)  # data: the bytes the runtime gets
        _check_program(program, named_sizes, data_bytes, trust_remote_code=trust_remote_code)
    except _TooLarge as exc:
        raise IntegrityError(f"{path.name} {exc.args[0]}", files) from None
    except (_Bad, KeyError) as exc:
        raise _integrity(path, exc, files) from None


def _mapped(path: Path, fd: int | None = None) -> memoryview:
    """The file mapped read-only (the one open at ``fd``, if given): only the pages the checks read (the flatbuffers,
    not the weights) are loaded."""
    with open(path, "rb") if fd is None else open(fd, "rb", closefd=False) as file:
        if file.seek(0, 2) < 48:
            raise _Bad(f"{file.tell()} bytes, shorter than its headers")
        return memoryview(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))


def _integrity(path: Path, exc: BaseException, files: list[str]) -> IntegrityError:
    reason = exc.args[0] if isinstance(exc, _Bad) else f"a field {exc} the schema does not have"
    return IntegrityError(f"{path.name} is not a program the ExecuTorch runtime can read safely: {reason}; the file "
                          "is damaged or crafted", files)


def _segment_base(buf: memoryview) -> int:
    """The segment base offset of the extended header (``eh00``), or 0 when the program has none."""
    if bytes(buf[8:12]) != b"eh00" or len(buf) < 32:
        return 0
    return struct.unpack_from("<Q", buf, 24)[0]


def _segment(buf: memoryview, program: _Table, index: int, base: int) -> tuple[int, int]:
    segments = program["segments"] or []
    if not 0 <= index < len(segments):
        raise _Bad(f"segment {index} of {len(segments)}")
    start, size = base + segments[index]["offset"], segments[index]["size"]
    if start + size > len(buf):
        raise _Bad(f"segment {index} at {start:,} of {size:,} bytes in a file of {len(buf):,}")
    return start, size


# The non-constant buffers a program may plan: a fixed base and so many bytes per byte of its files (_buffer_budget)
BUFFER_BASE_BYTES = 64 * 2**20
BUFFER_BYTES_PER_FILE_BYTE = 4


def _buffer_budget(file_size: int) -> int:
    """The most bytes of non-constant buffers (the execution plans' ``non_const_buffer_sizes``) a program may plan
    before it is refused: 64 MiB plus 4 bytes per byte of the program's files (``.pte`` and ``.ptd``), so an artifact
    under 1 MB plans under 68 MiB. The runtime allocates and zeroes them when the method loads: under the former
    bound alone (:func:`_memory_budget`) a 0.92 MB ``.pte`` planning 368 MiB of buffers grew the process by 368 MiB
    in ``load`` (issue 43's bounds probe). The ``.ptd`` counts: a generation program keeps its weights there. A real
    model plans fewer bytes of buffers than its weights have: all-MiniLM-L6-v2 with ``dynamic=True`` (90 MB of
    weights) 218 MiB at batch 8 x 512 tokens; a quantized model's weights are 4-8 times smaller than float32's,
    hence the factor 4."""
    return BUFFER_BASE_BYTES + BUFFER_BYTES_PER_FILE_BYTE * file_size


# The memory a program may plan in all (non-constant buffers and XNNPACK's values): a fixed base and so many bytes per
# byte of its files (_memory_budget)
MEMORY_BASE_BYTES = 192 * 2**20
MEMORY_BYTES_PER_FILE_BYTE = 64


def _memory_budget(file_size: int) -> int:
    """The most memory a program may plan in all before it is refused: its non-constant buffers plus, for each
    XNNPACK payload, the most bytes of its non-constant values alive at once at their declared dims (XNNPACK plans
    its workspace over the values' lifetimes: :func:`_live_peak`): 192 MiB plus 64 bytes per byte of the program's
    files (``.pte`` and ``.ptd``), so an artifact under 1 MB plans under 256 MiB (issue 43: 256 MiB over a warm
    process). It was 512 MiB + 512 bytes per byte over the values summed, which let a 1 MB artifact plan 1 GiB; a
    160 MiB base refused hfexport's own tiny seq2seq exports (T5/BART at ``max_cache_len=24, max_batch=2``: 190 MB
    planned for a 110 kB program, 156 MB of it XNNPACK's values at their declared dims). Real
    programs plan far less per byte: Qwen2.5-0.5B as hfexport exports it (a 0.3 MB ``.pte`` beside 1.9 GB of
    weights) 815 MiB (100 MiB of buffers, a 715 MiB peak for a 512-token prefill chunk), optimum-executorch's 9.9 GB
    for 2.4 GB; a seeded toy Llama 212 MiB for 222 MiB."""
    return MEMORY_BASE_BYTES + MEMORY_BYTES_PER_FILE_BYTE * file_size


def _check_program(buf: memoryview, named_sizes: dict[bytes, int], data_bytes: int = 0, *,
                   trust_remote_code: bool) -> None:
    schema = _program_schema()
    planned = 0  # bytes of memory the runtime will allocate for the program's values
    buffers = 0  # of which the non-constant buffers of the execution plans (allocated when a method loads)
    program = _root(buf, schema, "Program")
    base = _segment_base(buf)
    sizes = dict(named_sizes)
    for entry in program["named_data"] or []:
        key = entry["key"]
        _printable(key, "named-data key")
        sizes[key] = _segment(buf, program, entry["segment_index"], base)[1]
    inline = program["backend_delegate_data"] or []
    for plan in program["execution_plan"] or []:
        _printable(plan["name"], "method name")
        for operator in plan["operators"] or []:
            _printable(operator["name"], "operator name")
            _printable(operator["overload"], "operator overload")
        for value in plan["values"] or []:
            if value["val_type"] == [t for _, t in schema["unions"]["KernelTypes"]].index("Tensor") + 1:
                info = value["val"]["extra_tensor_info"]
                if info is not None:
                    _printable(info["fully_qualified_name"], "tensor name")
        plan_buffers = sum(max(size, 0) for size in plan["non_const_buffer_sizes"] or [])
        planned, buffers = planned + plan_buffers, buffers + plan_buffers
        for delegate in plan["delegates"] or []:
            backend = delegate["id"]
            _printable(backend, "backend id")
            for spec in delegate["compile_specs"] or []:
                _printable(spec["key"], "compile-spec key")
            if backend != b"XnnpackBackend":
                if trust_remote_code:
                    continue
                raise _Bad(f"a delegate for {backend.decode()}: only XnnpackBackend is read without "
                           "trust_remote_code=True (CudaBackend loads a shared library stored in the artifact)")
            processed = delegate["processed"]
            if processed is None:
                raise _Bad("a delegate without its data")
            if processed["location"] == 0:  # INLINE
                if not 0 <= processed["index"] < len(inline):
                    raise _Bad(f"inline delegate data {processed['index']} of {len(inline)}")
                start, size = inline[processed["index"]]["data"] or (0, 0)
            else:
                start, size = _segment(buf, program, processed["index"], base)
            planned += _check_xnnpack(buf[start: start + size], sizes)
    size = len(buf) + data_bytes
    if trust_remote_code:
        return
    what = (f"the {size:,} bytes of its .pte and .ptd: the artifact is damaged or crafted, or was exported with dynamic "
            "bounds larger than it is used at (export again with smaller --max-batch, --max-seq-len or "
            "--dim-upper-bound); one from a source you trust loads with trust_remote_code=True (CLI: "
            "--trust-remote-code)")
    if buffers > _buffer_budget(size):
        raise _TooLarge(f"plans {buffers:,} bytes of non-constant buffers, which the runtime allocates and zeroes when "
                        f"it loads the program, more than the {_buffer_budget(size):,} hfexport allows (64 MiB + 4 bytes "
                        f"per byte; hfexport_executorch._pte_check._buffer_budget) for {what}")
    if planned > _memory_budget(size):
        raise _TooLarge(f"plans {planned:,} bytes of memory for its values ({buffers:,} of buffers, {planned - buffers:,} "
                        f"of XNNPACK's values alive at once), more than the {_memory_budget(size):,} hfexport allows "
                        f"(192 MiB + 64 bytes per byte; hfexport_executorch._pte_check._memory_budget) for {what}")


def _check_xnnpack(blob: memoryview, named_sizes: dict[bytes, int]) -> int:
    """Check one XNNPACK payload; returns the most bytes of its non-constant values alive at once (XNNPACK plans
    its workspace over their lifetimes, reusing memory): :func:`_live_peak`."""
    if len(blob) >= 30 and bytes(blob[4:8]) == b"XH00":
        length, fb_offset, fb_size, const_offset = struct.unpack_from("<HIII", blob, 8)
        const_size = struct.unpack_from("<Q", blob, 22)[0]
        if length < 30 or fb_offset + fb_size > len(blob) or const_offset + const_size > len(blob):
            raise _Bad(f"an XNNPACK header (length {length}, flatbuffer {fb_offset}+{fb_size}, constants "
                       f"{const_offset}+{const_size}) that does not fit its {len(blob)} bytes")
        graph_bytes, constants = blob[fb_offset: fb_offset + fb_size], const_size
    else:
        graph_bytes, constants = blob, 0
    identifier = bytes(graph_bytes[4:8])
    if identifier not in (b"XN00", b"XN01"):
        raise _Bad(f"an XNNPACK payload with identifier {identifier!r}, not XN00 or XN01")
    schema = _xnnpack_schema()
    graph = _root(graph_bytes, schema, "XNNGraph")
    constant_data = graph["constant_data"] or []
    inline_buffers = graph["constant_buffer"] or [] if not constant_data else []
    values: dict[int, list[int]] = {}
    intermediate: dict[int, int] = {}  # bytes of each non-constant value
    for value in graph["xvalues"] or []:
        tensor = value["xvalue_union"]
        if tensor is None:
            raise _Bad("an XNNPACK value of no type")
        quantized = tensor if tensor.name == "XNNQuantizedTensorValue" else None
        if quantized is not None:
            tensor = quantized["tensor_value"]
            if tensor is None:
                raise _Bad("a quantized XNNPACK value without its tensor")
        dims = tensor["dims"] or []
        if tensor["num_dims"] != len(dims) or len(dims) > _MAX_DIMS:
            raise _Bad(f"an XNNPACK tensor of num_dims {tensor['num_dims']} with {len(dims)} dims")
        numel = 1
        for dim in dims:
            numel *= dim
        if numel > _MAX_NUMEL:
            raise _Bad(f"an XNNPACK tensor of dims {dims}")
        if tensor["id_out"] in values:
            raise _Bad(f"XNNPACK value {tensor['id_out']} defined twice")
        values[tensor["id_out"]] = dims
        index = tensor["constant_buffer_idx"]
        if not index:
            intermediate[tensor["id_out"]] = numel * _XNN_BITS.get(tensor["datatype"], 32) // 8
        if index:
            bits = _XNN_BITS.get(tensor["datatype"])
            if bits is None:
                raise _Bad(f"an XNNPACK constant of datatype {tensor['datatype']}")
            needed = (numel * bits + 7) // 8
            available = _constant_size(index, constant_data, inline_buffers, constants, named_sizes)
            if available < needed:
                raise _Bad(f"an XNNPACK constant of dims {dims} ({needed:,} bytes) backed by {available:,} bytes")
        if quantized is not None:
            _check_quant_params(quantized, dims, constant_data, inline_buffers, constants, named_sizes)
    defined = set(values)
    span: dict[int, list[int]] = {}  # value id: [first node, last node] naming it
    nodes = graph["xnodes"] or []
    for position, node in enumerate(nodes):
        operation = node["xnode_union"]
        if operation is None:
            raise _Bad("an XNNPACK node of no type")
        for field, _ in operation.schema["tables"][operation.name]:
            for id_ in _check_node_field(operation, field, defined, values):
                span.setdefault(id_, [position, position])[1] = position
    external = set()
    for field in ("input_ids", "output_ids"):
        for id_ in graph[field] or []:
            if id_ not in defined:
                raise _Bad(f"XNNPACK graph {field} names value {id_}, which it does not define")
            external.add(id_)
    return _live_peak(intermediate, span, external, len(nodes))


def _live_peak(sizes: dict[int, int], span: dict[int, list[int]], external: set[int], nodes: int) -> int:
    """The most bytes of ``sizes``' values alive at one node: a value from the first node that names it to the last;
    one the graph takes or gives (``external``) or no node names, at every node (counted whole: XNNPACK may still
    allocate it). XNNPACK's planner places values by their lifetimes and reuses memory, so its workspace is this
    peak (and the fragmentation its placement leaves); summed over all values, a dynamic test model's
    (all-MiniLM-shaped, 0.9 MB) came to 604 MiB where its peak is a small part of it."""
    always = 0
    change = [0] * (nodes + 1)
    for id_, size in sizes.items():
        if id_ in external or id_ not in span:
            always += size
            continue
        first, last = span[id_]
        change[first] += size
        change[last + 1] -= size
    peak = alive = 0
    for delta in change:
        alive += delta
        peak = max(peak, alive)
    return always + peak


def _check_node_field(operation: _Table, field: str, defined: set[int], values: dict[int, list[int]]) -> list[int]:
    """Check one field of a node; returns the value ids it names (none for a scalar or list parameter)."""
    value = operation[field]
    where = f"XNNPACK {operation.member}.{field}"
    if field.endswith("_id"):
        arity = re.fullmatch(r"XNNConcatenate(\d)", operation.member)
        if arity and re.fullmatch(r"input\d_id", field) and int(field[5]) > int(arity[1]):
            return []  # an input the node's arity does not read
        if value not in defined and not (value == _INVALID_ID and field in ("bias_id", "mask_id", "scale_id")):
            raise _Bad(f"{where} names value {value}, which the graph does not define")
        return [value]
    if field.endswith("_ids"):
        for id_ in value or []:
            if id_ not in defined:
                raise _Bad(f"{where} names value {id_}, which the graph does not define")
        return list(value or [])
    if isinstance(value, list):
        rank = operation["num_dims"] if "num_dims" in operation.slots else None
        if rank is None and "input_id" in operation.slots:
            rank = len(values.get(operation["input_id"], []))
        if rank is not None and len(value) != rank:
            raise _Bad(f"{where} has {len(value)} entries for {rank} dims")
    return []


def _constant_size(index: int, constant_data: list[_Table], inline_buffers: list[_Table], constants: int,
                   named_sizes: dict[bytes, int]) -> int:
    if constant_data:
        if not 0 <= index < len(constant_data):
            raise _Bad(f"XNNPACK constant {index} of {len(constant_data)}")
        entry = constant_data[index]
        key = entry["named_key"]
        if key:
            _printable(key, "XNNPACK constant key")
            if key not in named_sizes:
                raise _Bad(f"XNNPACK constant key {key.decode()} is in neither the program's named data nor the .ptd")
            return named_sizes[key]
        if entry["offset"] + entry["size"] > constants:
            raise _Bad(f"XNNPACK constant {index} at {entry['offset']:,} of {entry['size']:,} bytes outside its "
                       f"{constants:,} bytes of constants")
        return entry["size"]
    if not 0 <= index < len(inline_buffers):
        raise _Bad(f"XNNPACK constant buffer {index} of {len(inline_buffers)}")
    return (inline_buffers[index]["storage"] or (0, 0))[1]


def _check_quant_params(quantized: _Table, dims: list[int], constant_data: list[_Table],
                        inline_buffers: list[_Table], constants: int, named_sizes: dict[bytes, int]) -> None:
    params = quantized["quant_params"]
    if params is None:
        raise _Bad("a quantized XNNPACK value without its parameters")
    if params.name not in ("PerChannelQuant", "PerChannelGroupQuant"):
        return  # per tensor or per token: scalars only
    channel = params["channel_dim"]
    if not 0 <= channel < len(dims):
        raise _Bad(f"XNNPACK {params.name}.channel_dim {channel} of a {len(dims)}-dim tensor")
    expected = dims[channel]
    if params.name == "PerChannelGroupQuant":
        group = params["group_size"]
        if len(dims) != 2 or group <= 0 or dims[1] % group:
            raise _Bad(f"XNNPACK group quantization of group size {group} over dims {dims}")
        expected = dims[0] * dims[1] // group
    scales = params["scale"]
    if params["scale_buffer_idx"]:
        if params["num_scales"] != expected:
            raise _Bad(f"XNNPACK {params.name} with {params['num_scales']} scales for {expected} channels")
        needed = expected * (2 if params.name == "PerChannelGroupQuant" else 4)
        available = _constant_size(params["scale_buffer_idx"], constant_data, inline_buffers, constants, named_sizes)
        if available < needed:
            raise _Bad(f"XNNPACK scales of {needed:,} bytes backed by {available:,} bytes")
    elif scales is None or len(scales) != expected:
        raise _Bad(f"XNNPACK {params.name} with {0 if scales is None else len(scales)} scales for {expected} "
                   "channels")


def _ptd_named_sizes(path: Path, fd: int | None = None) -> dict[bytes, int]:
    """``{key: size}`` of a ``.ptd``'s named data, each segment inside the file (the one open at ``fd``, if given)."""
    buf = _mapped(path, fd)
    if bytes(buf[4:8]) != b"FT01" or bytes(buf[8:12]) != b"FH01":
        raise _Bad("not a .ptd (identifier FT01, header FH01)")
    segment_base = struct.unpack_from("<Q", buf, 32)[0]
    table = _root(buf, _flat_tensor_schema(), "FlatTensor")
    segments = table["segments"] or []
    sizes = {}
    for entry in table["named_data"] or []:
        key, index = entry["key"], entry["segment_index"]
        _printable(key, "named-data key")
        if not 0 <= index < len(segments):
            raise _Bad(f"segment {index} of {len(segments)}")
        start, size = segment_base + segments[index]["offset"], segments[index]["size"]
        if start + size > len(buf):
            raise _Bad(f"segment {index} at {start:,} of {size:,} bytes in a file of {len(buf):,}")
        sizes[key] = size
    return sizes
