"""The members of a ``.pt2`` (a zip), read by hfexport with ``zipfile`` alone (see :mod:`hfexport_dynamo._pt2` for
the whole reader): the layout ``torch.export.save`` writes (:class:`_Members`), weights and constants built from
their raw bytes (never a pickle), and the sample inputs through :class:`RestrictedUnpickler`
(:func:`unpickle_sample_inputs`).
"""

from __future__ import annotations

import collections
import io
import pickle
import re
import struct
import zipfile
import zlib
from typing import Any

import torch

from hfexport import IntegrityError, UntrustedArtifactError
from hfexport.trust import parse_json

__all__ = ["PT2_MAX_CENTRAL_BYTES", "PT2_MAX_MEMBERS", "TRUST_HINT", "RestrictedUnpickler", "unpickle_sample_inputs"]

TRUST_HINT = ("hfexport runs no code from an artifact: pass trust_remote_code=True (CLI: --trust-remote-code) only "
              "for an artifact from a source you trust")


# ── the archive: one reader, the layout torch writes ──────────────────────────────────────────────────────
# Members of a .pt2 (a weight or constant each, and a few records): a 30 B mixture of experts has ~20k tensors. At
# 1,000,000 a 103 MiB archive of empty members took 17 s and +692 MiB before its layout was refused (issue 43's
# bounds probe): zipfile builds a ZipInfo (~0.7 KB) per entry of the central directory, whose size is read from the
# end record and bounded first (128 bytes a member; an entry takes at least 46).
PT2_MAX_MEMBERS = 100_000
PT2_MAX_CENTRAL_BYTES = 128 * PT2_MAX_MEMBERS
_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,99}"
_ROOT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_PT2_FIXED = frozenset({"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"})
_LAYOUT = re.compile(rf"models/{_NAME}\.json|data/weights/{_NAME}_weights_config\.json|data/weights/weight_[0-9]{{1,9}}"
                     rf"|data/constants/{_NAME}_constants_config\.json|data/constants/tensor_[0-9]{{1,9}}"
                     rf"|data/sample_inputs/{_NAME}\.pt")
# torch.save's zip (the sample inputs)
_SAVE_FIXED = frozenset({"data.pkl", ".format_version", ".storage_alignment", "byteorder", "version",
                         ".data/serialization_id", ".data/version"})
_SAVE_LAYOUT = re.compile(r"data/[0-9]{1,9}")


class BufferFile(io.RawIOBase):
    """A read-only, seekable file over a buffer (a ``bytearray``) that copies nothing but what is read:
    ``io.BytesIO`` copies a buffer other than ``bytes`` whole."""

    def __init__(self, buffer: Any):
        super().__init__()
        self.view = memoryview(buffer).cast("B")
        self.at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, into: Any) -> int:
        count = max(0, min(len(into), len(self.view) - self.at))
        into[:count] = self.view[self.at:self.at + count]
        self.at += count
        return count

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = max(0, offset + (0, self.at, len(self.view))[whence])
        return self.at

    def tell(self) -> int:
        return self.at


_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and the extra field's lengths at 26 and 28


def _check_central_directory(source: Any, what: str) -> None:
    """Refuse an archive whose end record gives a central directory of more than :data:`PT2_MAX_CENTRAL_BYTES` or
    more than :data:`PT2_MAX_MEMBERS` entries (zip64 included), before ``zipfile`` reads an entry of it."""
    source.seek(0, 2)
    size = source.tell()
    source.seek(max(0, size - (1 << 16) - 22))
    tail = source.read()
    source.seek(0)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return  # not a zip: zipfile says so
    entries, central = int.from_bytes(tail[at + 10:at + 12], "little"), int.from_bytes(tail[at + 12:at + 16], "little")
    at64 = tail.rfind(b"PK\x06\x06", 0, at)
    if at64 >= 0 and at64 + 56 <= len(tail):  # zip64: the counts of its own end record
        entries = max(entries, int.from_bytes(tail[at64 + 32:at64 + 40], "little"))
        central = max(central, int.from_bytes(tail[at64 + 40:at64 + 48], "little"))
    if central > PT2_MAX_CENTRAL_BYTES or entries > PT2_MAX_MEMBERS:
        raise ValueError(f"{what} has a central directory of {central:,} bytes and {entries:,} members, over the "
                         f"bound of {PT2_MAX_CENTRAL_BYTES:,} bytes and {PT2_MAX_MEMBERS:,} members (hfexport_dynamo."
                         "_pt2_archive.PT2_MAX_CENTRAL_BYTES, PT2_MAX_MEMBERS): the archive is damaged or crafted")


class _Members:
    """The members of a zip archive read with ``zipfile`` as the only reader, checked against a layout. Over a
    :class:`BufferFile`, :meth:`view` gives a member's bytes in place (what torch's writer stores: no copy)."""

    def __init__(self, source: Any, what: str, fixed: frozenset[str], layout: re.Pattern[str], size: int):
        self.what = what
        self.buffer = source.view if isinstance(source, BufferFile) else None
        _check_central_directory(source, what)
        try:
            # Names are read as UTF-8 whether or not their UTF-8 flag is set (torch writes ASCII names): zipfile would
            # otherwise decode an unflagged name as cp437, importing that codec while an artifact is read.
            self.zip = zipfile.ZipFile(source, metadata_encoding="utf-8")
            infos = self.zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError,
                NotImplementedError) as exc:  # NotImplementedError: "zip file version 22.6" (a flipped byte)
            raise IntegrityError(f"{what} is not a zip archive ({exc}): the file is damaged or crafted",
                                 [what.split(":")[0]]) from None
        if len(infos) > PT2_MAX_MEMBERS:
            raise ValueError(f"{what} has {len(infos):,} members (at most {PT2_MAX_MEMBERS:,})")
        self.records: dict[str, zipfile.ZipInfo] = {}
        folded: dict[str, str] = {}
        roots = set()
        total = 0
        for info in infos:
            name = info.filename
            root, _, record = name.partition("/")
            if info.flag_bits & 0x1 or info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{what}: member {name!r:.120} is encrypted or compressed; torch writes stored "
                                 "members only")
            if not _ROOT.fullmatch(root) or root in (".", "..") or not (record in fixed or layout.fullmatch(record)):
                raise ValueError(f"{what}: member {name!r:.120} is outside the layout torch writes")
            if record in self.records:
                raise ValueError(f"{what}: member {name!r:.120} appears twice")
            if record.casefold() in folded:
                raise ValueError(f"{what}: members {folded[record.casefold()]!r} and {record!r} differ only in case")
            folded[record.casefold()] = record
            roots.add(root)
            total += info.file_size
            self.records[record] = info
        if len(roots) > 1:
            raise ValueError(f"{what} has members under several root folders: {sorted(roots)[:4]}")
        if total > size:
            raise ValueError(f"{what}: its members hold {total:,} bytes, more than the archive's {size:,}")
        self.used: set[str] = set()

    def read(self, record: str) -> bytes:
        if record not in self.records:
            raise ValueError(f"{self.what} has no member {record!r}")
        if record in self.used:
            raise ValueError(f"{self.what}: member {record!r} is read twice")
        self.used.add(record)
        try:
            return self.zip.read(self.records[record])
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
            raise IntegrityError(f"{self.what}: member {record!r} is damaged ({exc}): the file is damaged or crafted",
                                 [self.what.split(":")[0]]) from None

    def view(self, record: str) -> memoryview:
        """Member ``record``'s bytes in the archive's buffer, not copied: its local header checked as ``zipfile``
        checks it when it reads (signature, the name the directory gives), its bounds, its CRC-32."""
        if self.buffer is None:
            raise ValueError(f"{self.what} is not read from a buffer")
        if record not in self.records:
            raise ValueError(f"{self.what} has no member {record!r}")
        if record in self.used:
            raise ValueError(f"{self.what}: member {record!r} is read twice")
        self.used.add(record)
        info, buffer = self.records[record], self.buffer
        start = info.header_offset
        header = bytes(buffer[start:start + _LOCAL_HEADER.size])
        problem = None
        if len(header) < _LOCAL_HEADER.size or _LOCAL_HEADER.unpack(header)[0] != zipfile.stringFileHeader:
            problem = "no local header where the directory points"
        else:
            name_size, extra_size = _LOCAL_HEADER.unpack(header)[1:]
            begin = start + _LOCAL_HEADER.size + name_size + extra_size
            name = bytes(buffer[start + _LOCAL_HEADER.size:start + _LOCAL_HEADER.size + name_size])
            if name != info.orig_filename.encode("utf-8"):
                problem = f"its local header names {name[:120]!r}"
            elif begin + info.file_size > len(buffer) or info.compress_size != info.file_size:
                problem = "its bytes run past the archive"
            elif zlib.crc32(buffer[begin:begin + info.file_size]) != info.CRC:
                problem = "Bad CRC-32"
        if problem is not None:
            raise IntegrityError(f"{self.what}: member {record!r} is damaged ({problem}): the file is damaged or "
                                 "crafted", [self.what.split(":")[0]])
        return buffer[begin:begin + info.file_size]

    def unused(self) -> list[str]:
        return sorted(set(self.records) - self.used)


# ── the sample inputs: a restricted unpickler ───────────────────────────────────────────────────────────
_DTYPE_OF_STORAGE = {f"{name}Storage": dtype for name, dtype in (
    ("Double", torch.float64), ("Float", torch.float32), ("Half", torch.float16), ("BFloat16", torch.bfloat16),
    ("Long", torch.int64), ("Int", torch.int32), ("Short", torch.int16), ("Char", torch.int8),
    ("Byte", torch.uint8), ("Bool", torch.bool), ("ComplexFloat", torch.complex64),
    ("ComplexDouble", torch.complex128))}


class _StorageType:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


class _Storage:
    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor  # flat, on the CPU


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                    hooks: Any = None, metadata: Any = None) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` with its arguments checked: a storage of this archive, int sizes."""
    ints = (offset, *size, *stride) if isinstance(size, tuple) and isinstance(stride, tuple) else None
    if not isinstance(storage, _Storage) or ints is None or len(size) != len(stride) or len(size) > 64 \
            or not all(type(i) is int and 0 <= i < 2**62 for i in ints) or type(requires_grad) is not bool \
            or not (hooks is None or (isinstance(hooks, dict) and not hooks)) or metadata is not None:
        raise pickle.UnpicklingError("a tensor rebuilt from arguments torch.save does not write")
    try:
        return torch.as_strided(storage.tensor, size, stride, offset).requires_grad_(requires_grad)
    except RuntimeError as exc:
        raise pickle.UnpicklingError(f"a tensor outside its storage ({exc})") from None


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", name): _StorageType(dtype) for name, dtype in _DTYPE_OF_STORAGE.items()},
}
# opcodes that call something other than an allow-listed global, or reach the copyreg extension registry
_REFUSED_OPCODES = (pickle.BUILD, pickle.INST, pickle.OBJ, pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.EXT1, pickle.EXT2,
                    pickle.EXT4, pickle.PERSID)


class RestrictedUnpickler(pickle._Unpickler):  # the pure-Python unpickler: its opcode table can be narrowed
    """Unpickles ``torch.save`` output of tensors and containers only: ``find_class`` admits the globals of
    :data:`_ALLOWED_GLOBALS` (a tensor rebuilder of hfexport's, typed storages as markers, ``OrderedDict``) and
    nothing else; ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``, ``EXT1/2/4`` and text ``PERSID`` are not
    in its opcode table; a storage comes from the archive's own ``data/<key>`` member."""

    dispatch = {k: v for k, v in pickle._Unpickler.dispatch.items() if k not in
                {op[0] for op in _REFUSED_OPCODES}}

    def __init__(self, data: bytes, members: _Members):
        super().__init__(io.BytesIO(data))
        self.members = members
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not among the globals torch.save writes for "
                                         "tensors")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)
                and isinstance(pid[2], str) and re.fullmatch(r"[0-9]{1,9}", pid[2]) and type(pid[4]) is int):
            raise pickle.UnpicklingError(f"a persistent id torch.save does not write: {pid!r:.120}")
        _, storage_type, key, _, numel = pid
        if key not in self.storages:
            data = bytearray(self.members.read(f"data/{key}"))
            if len(data) != numel * storage_type.dtype.itemsize:
                raise pickle.UnpicklingError(f"storage {key} holds {len(data)} bytes, not {numel} elements")
            tensor = torch.frombuffer(data, dtype=storage_type.dtype) if data else torch.empty(
                0, dtype=storage_type.dtype)
            self.storages[key] = _Storage(tensor)
        storage = self.storages[key]
        if storage.tensor.dtype != storage_type.dtype:
            raise pickle.UnpicklingError(f"storage {key} is read with two dtypes")
        return storage


def _leaves_are_tensors(value: Any, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if isinstance(value, torch.Tensor) or value is None or type(value) in (int, float, bool, str):
        return True
    if type(value) in (tuple, list):
        return all(_leaves_are_tensors(v, depth + 1) for v in value)
    if type(value) in (dict, collections.OrderedDict):
        return all(type(k) is str and _leaves_are_tensors(v, depth + 1) for k, v in value.items())
    return False


def unpickle_sample_inputs(data: bytes, what: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` a ``torch.save`` zip holds, through :class:`RestrictedUnpickler`.

    Raises:
        UntrustedArtifactError: the pickle asks for anything else (names what).
        ValueError: not a ``torch.save`` zip of that layout.
    """
    members = _Members(io.BytesIO(data), what, _SAVE_FIXED, _SAVE_LAYOUT, len(data))
    for record in sorted(members.records):
        if record not in ("data.pkl",) and not record.startswith("data/"):
            members.read(record)  # version and byte-order records: checked below where they matter
    try:
        value = RestrictedUnpickler(members.read("data.pkl"), members).load()
    except (pickle.UnpicklingError, KeyError, IndexError, TypeError, AttributeError, EOFError, ValueError,
            RecursionError, MemoryError, OverflowError) as exc:
        raise UntrustedArtifactError(f"{what}: unpickling it would need what hfexport's restricted unpickler "
                                     f"refuses ({type(exc).__name__}: {exc}). {TRUST_HINT}") from None
    if members.unused():
        raise ValueError(f"{what}: members no tensor uses: {members.unused()[:8]}")
    if not (isinstance(value, tuple) and len(value) == 2 and type(value[0]) is tuple and type(value[1]) is dict
            and _leaves_are_tensors(value)):
        raise UntrustedArtifactError(f"{what} holds a {type(value).__name__}, not (args, kwargs) of tensors")
    return value


# ── weights and constants: raw bytes, never a pickle ─────────────────────────────────────────────────────
_IDENTIFIER_TEXT = re.compile(r"[A-Za-z0-9_.:#@+\-]{0,1000}")  # names, FQNs, targets, versions


def _payloads(members: _Members, config_record: str, directory: str, prefix: str, what: str) -> dict[str, Any]:
    from torch._export.serde import schema
    from torch._export.serde.serialize import (
        _dict_to_dataclass,
        deserialize_device,
        deserialize_scalar_type,
        deserialize_size,
        deserialize_storage_offset,
        deserialize_stride,
    )

    if config_record not in members.records:
        raise ValueError(f"{what} has no {config_record}")
    raw = parse_json(members.read(config_record))
    config = _dict_to_dataclass(schema.PayloadConfig, raw)
    files: dict[str, torch.Tensor] = {}
    out: dict[str, Any] = {}
    for fqn, meta in config.config.items():
        if not _IDENTIFIER_TEXT.fullmatch(fqn):
            raise UntrustedArtifactError(f"{what}: {config_record} names {fqn!r:.120}, which is not a name. {TRUST_HINT}")
        path_name = meta.path_name
        if meta.use_pickle or not isinstance(path_name, str) or not re.fullmatch(rf"{prefix}[0-9]{{1,9}}", path_name):
            kind = ("a pickle (torch.load with weights_only=False)" if meta.use_pickle
                    else f"{path_name!r:.60}, not a raw tensor ({prefix}N)")
            raise UntrustedArtifactError(f"{what}: {fqn!r:.80} in {config_record} is {kind}; hfexport reads raw "
                                         f"tensors only. {TRUST_HINT}")
        tensor_meta = meta.tensor_meta
        if tensor_meta is None:
            raise ValueError(f"{what}: {fqn!r:.80} has no tensor_meta")
        dtype = deserialize_scalar_type(tensor_meta.dtype)
        device = deserialize_device(tensor_meta.device)
        if path_name not in files:  # the archive's own bytes where it is a buffer (no copy), else a copy of them
            data = members.view(f"{directory}{path_name}") if members.buffer is not None \
                else bytearray(members.read(f"{directory}{path_name}"))
            if len(data) % dtype.itemsize:
                raise ValueError(f"{what}: {directory}{path_name} holds {len(data)} bytes, not whole {dtype}")
            flat = torch.frombuffer(data, dtype=dtype) if len(data) else torch.empty(0, dtype=dtype)
            files[path_name] = flat if flat.data_ptr() % dtype.itemsize == 0 else flat.clone()  # aligned, else copied
        flat = files[path_name]
        if flat.dtype != dtype:
            raise ValueError(f"{what}: {directory}{path_name} is read with two dtypes")
        try:
            tensor = torch.as_strided(flat, deserialize_size(tensor_meta.sizes), deserialize_stride(tensor_meta.strides),
                                      deserialize_storage_offset(tensor_meta.storage_offset))
        except (RuntimeError, AssertionError, TypeError, ValueError) as exc:
            raise ValueError(f"{what}: {fqn!r:.80} does not fit its bytes ({exc})") from None
        if device.type != "cpu":
            tensor = tensor.to(device)
        if meta.is_param:
            out[fqn] = torch.nn.Parameter(tensor, requires_grad=tensor_meta.requires_grad)
        else:
            out[fqn] = tensor.requires_grad_(bool(tensor_meta.requires_grad)) if tensor.is_floating_point() else tensor
    return out

