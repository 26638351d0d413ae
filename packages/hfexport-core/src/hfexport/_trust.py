"""An artifact is untrusted input when loaded: the checks ``hfexport.load`` makes before any runtime opens it. This
module holds the manifest's part (its errors, bounds, bounded JSON reader and schema); the others are named below.

- The manifest is validated against its schema (:func:`validate_manifest`): one line per problem (not an object, a
  missing key, a wrong type).
- Every file it names (``files``, ``files_sha256``, and every ``*_file`` key of a component, at any depth)
  resolves inside the artifact directory: no absolute paths, no ``..``, and symlinks only to files within the
  directory (or, for an artifact in a Hugging Face cache snapshot, into that repository's ``blobs/``)
  (:func:`hfexport._artifact_files.read_manifest`, :func:`~hfexport._artifact_files.check_file_paths`).
- Every file's size and SHA-256 match the manifest's ``files_sha256``, checked before any runtime opens it.
- Every file a runner opens is one the manifest names and hashes
  (:func:`~hfexport._artifact_files.artifact_file`): no default file names. A schema-1 manifest (no hashes) is
  refused unless ``trust_remote_code=True`` (:func:`~hfexport._artifact_files.check_integrity`).
- The manifest is bounded: at most :data:`MANIFEST_MAX_BYTES`, JSON nested at most :data:`JSON_MAX_DEPTH` deep,
  integers of at most :data:`JSON_MAX_INT_DIGITS` digits (:func:`parse_json`); beyond, a :class:`ManifestError`.
- No code runs from it: pytree specs are read by :func:`hfexport._named_types.load_treespec`, hfexport's own
  reader, which admits only the types of :func:`~hfexport._named_types.allowed_pytree_type` (builtins containers,
  and what a tracer allows through :func:`~hfexport._named_types.allow_pytree_types`), refuses ``defaultdict`` and
  every context that names a module (an enum), and imports nothing. Pickled bytes are unpickled only by a
  backend's restricted unpickler (``hfexport_dynamo``'s ``.pt2`` reader), never by ``torch.load`` with
  ``weights_only=False``, unless the caller passes ``trust_remote_code=True``; :mod:`hfexport._pickle_globals`
  lists the globals a pickle would import without unpickling it.

Nothing here imports torch at import time (``hfexport --help`` stays fast).
"""

from __future__ import annotations

import gc
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

MANIFEST_NAME = "export.json"
SCHEMA_VERSION = 2  # 2: files_sha256 and components are required (1 is still read)

__all__ = ["HASHES_KEY", "IntegrityError", "JSON_MAX_DEPTH", "MANIFEST_MAX_BYTES", "MANIFEST_MAX_FILES", "MANIFEST_NAME",
           "ManifestError", "SCHEMA_VERSION", "UntrustedArtifactError", "manifest_file_refs", "parse_json",
           "validate_manifest"]

HASHES_KEY = "files_sha256"
# Qwen2-0.5B's generation manifest (24 layers) is 199 KB, so an 80-layer one ~0.5 MB. At 4 MiB, lists nested to the
# depth bound took 15.9 s of load (4.8 s of CPU, at load 8 on 2 cores; issue 43's bounds probe): every container a
# manifest holds is scanned again by each later garbage collection of the process
MANIFEST_MAX_BYTES = 2 * 2**20
MANIFEST_MAX_FILES = 256  # distinct file names a manifest may name (an artifact has a handful)
PATH_MAX_CHARS = 1024  # a named file's path, in characters
PATH_MAX_PARTS = 16  # its components (folders and the file)
PATH_PART_MAX_BYTES = 255  # one component, in UTF-8 bytes (NAME_MAX of Linux file systems)
JSON_MAX_DEPTH = 64  # hfexport writes at most ~12 levels
JSON_MAX_INT_DIGITS = 24  # a byte count or an int64 bound has at most 20 digits
TRUST_HINT = ("hfexport.load runs no code from an artifact; pass trust_remote_code=True (CLI: --trust-remote-code) "
              "only for an artifact from a source you trust")


class ManifestError(ValueError):
    """``export.json`` is not a manifest this hfexport reads; the message has one line per problem."""

    def __init__(self, path: Any, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{path} is not a valid hfexport manifest ({len(self.problems)} "
                         f"problem{'s' if len(self.problems) != 1 else ''}):\n{lines}")


class IntegrityError(ValueError):
    """A file of an artifact differs from what its manifest recorded (size or SHA-256)."""

    def __init__(self, message: str, files: list[str] | None = None):
        super().__init__(message)
        self.files = list(files or [])


class UntrustedArtifactError(ValueError):
    """Loading the artifact would run code from it (unpickle an object, import a module it names, load native
    code); refused unless the caller passes ``trust_remote_code=True``."""


# ── the manifest's schema ─────────────────────────────────────────────────────────────────────────────────
_HEX64 = re.compile(r"[0-9a-f]{64}")
# key -> (types, required from schema version)
_TOP_KEYS: dict[str, tuple[tuple[type, ...], int | None]] = {
    "schema_version": ((int,), 1),
    "backend": ((str,), 1),
    "files": ((list,), 1),
    HASHES_KEY: ((dict,), 2),
    "components": ((dict,), 2),
    "model_class": ((str,), None),
    "model_module": ((str,), None),
    "source_dtype": ((str,), None),
    "created": ((str,), None),
    "dynamic": ((bool,), None),
    "config": ((dict,), None),
    "versions": ((dict,), None),
    "tested_versions": ((dict,), None),
    "workarounds": ((dict,), None),
    "timings_s": ((dict,), None),
    "notes": ((list,), None),
    "verification": ((dict,), None),
    "task": ((str,), None),
    "generation": ((dict,), None),
}
_SECTION_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "inputs": ((list,), True),
    "outputs": ((list,), True),
    "output_spec": ((str,), False),
    "output_modules": ((list,), False),
    "fixed_kwargs": ((dict,), False),
    "ignored_inputs": ((list,), False),
}


def _type_names(types: tuple[type, ...]) -> str:
    names = {list: "a list", dict: "an object", str: "a string", int: "an integer", bool: "true or false"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _check_type(problems: list[str], where: str, value: Any, types: tuple[type, ...]) -> bool:
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        problems.append(f"{where} must be {_type_names(types)}, got {_json_type(value)}")
    return ok


def _check_entries(problems: list[str], where: str, entries: list[Any]) -> None:
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"{where}[{i}] must be an object with a 'name', got {_json_type(entry)}")
        elif not isinstance(entry.get("name"), str):
            problems.append(f"{where}[{i}].name must be a string, got {_json_type(entry.get('name'))}")


def _check_section(problems: list[str], where: str, section: Any, required: bool) -> None:
    if not isinstance(section, dict):
        problems.append(f"{where} must be an object, got {_json_type(section)}")
        return
    for key, (types, needed) in _SECTION_KEYS.items():
        if key not in section:
            if needed and required:
                problems.append(f"{where} lacks required key {key!r}")
            continue
        if _check_type(problems, f"{where}.{key}", section[key], types) and key in ("inputs", "outputs"):
            _check_entries(problems, f"{where}.{key}", section[key])


def _file_keys(node: Any, where: str) -> Iterator[tuple[str, Any, str]]:
    """``(key, value, dotted location)`` of every ``*_file`` key in ``node``, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            at = f"{where}.{key}"
            if isinstance(key, str) and key.endswith("_file") and not isinstance(value, dict | list):
                if value is not None:
                    yield key, value, at
            else:
                yield from _file_keys(value, at)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _file_keys(value, f"{where}[{i}]")


def validate_manifest(manifest: Any, where: Any = "export.json", *, supported: Iterable[int] = (1, 2)) -> None:
    """Check ``manifest`` against the schema; raise one :class:`ManifestError` listing every problem.

    Schema version 2 (this hfexport writes it) requires ``components`` and ``files_sha256``; version 1
    manifests (written before file hashes) are read without them.

    Raises:
        ManifestError: not an object, a missing key, a value of the wrong type, an unsupported schema version.
    """
    if not isinstance(manifest, dict):
        raise ManifestError(where, [f"the manifest must be a JSON object, got {_json_type(manifest)}"])
    problems: list[str] = []
    version = manifest.get("schema_version")
    supported = tuple(supported)
    if "schema_version" in manifest and (not isinstance(version, int) or isinstance(version, bool)
                                         or version not in supported):
        problems.append(f"schema_version is {version!r}; this hfexport reads versions "
                        f"{', '.join(map(str, supported))}: re-export, or install the hfexport that wrote it")
        version = max(supported)
    for key, (types, required_from) in _TOP_KEYS.items():
        if key not in manifest:
            if required_from is not None and isinstance(version, int) and version >= required_from:
                problems.append(f"lacks required key {key!r}")
            continue
        if key != "schema_version":
            _check_type(problems, key, manifest[key], types)
    files = manifest.get("files")
    if isinstance(files, list):
        for i, name in enumerate(files):
            if not isinstance(name, str):
                problems.append(f"files[{i}] must be a file name (a string), got {_json_type(name)}")
    hashes = manifest.get(HASHES_KEY)
    if isinstance(hashes, dict):
        for name, entry in hashes.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                    or not _HEX64.fullmatch(entry["sha256"]) or not isinstance(entry.get("size"), int) \
                    or isinstance(entry.get("size"), bool) or entry["size"] < 0:
                problems.append(f"{HASHES_KEY}[{name!r}] must be {{'sha256': 64 hex digits, 'size': bytes}}, "
                                f"got {entry!r:.80}")
        # every file the manifest names (files, every *_file key) is hashed: a runner opens no other file
        unhashed = sorted({f for _, f in manifest_file_refs(manifest) if f != MANIFEST_NAME and f not in hashes
                           and _plain_relative(f)})  # the others: check_file_paths names them
        if unhashed:
            problems.append(f"{HASHES_KEY} has no entry for {unhashed}: the artifact is damaged or crafted")
    components = manifest.get("components")
    if isinstance(components, dict):
        if not components:
            problems.append("components must name at least one component")
        for name, section in components.items():
            _check_section(problems, f"components[{name!r}]", section, required=True)
    elif "components" not in manifest:  # version 1 without components: the top level is the one component
        _check_section(problems, "the manifest", manifest, required=False)
    for _, value, at in _file_keys({k: v for k, v in manifest.items() if k not in _RECORD_KEYS}, ""):
        if not isinstance(value, str):
            problems.append(f"{at.removeprefix('.')} must be a file name (a string), got {_json_type(value)}")
    if problems:
        raise ManifestError(where, problems)


# ── the files a manifest names ────────────────────────────────────────────────────────────────────────────
def manifest_file_refs(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(where, file name)`` of every file the manifest names: ``files``, ``files_sha256`` and every ``*_file``
    key of every component (at any depth)."""
    files, hashes = manifest.get("files"), manifest.get(HASHES_KEY)
    refs = [(f"files[{i}]", f) for i, f in enumerate(files if isinstance(files, list) else []) if isinstance(f, str)]
    refs += [(f"{HASHES_KEY}[{f!r}]", f) for f in (hashes if isinstance(hashes, dict) else {})]
    # Every other key, at any depth (the top level repeats the default component's keys), but the records
    # that describe the export (the config's reprs, versions, workarounds, the verification report).
    sections = {k: v for k, v in manifest.items() if k not in _RECORD_KEYS}
    refs += [(at.removeprefix("."), value) for _, value, at in _file_keys(sections, "") if isinstance(value, str)]
    return refs


_RECORD_KEYS = frozenset({"files", HASHES_KEY, "config", "versions", "tested_versions", "workarounds", "timings_s",
                          "notes", "verification"})


def _plain_relative(name: str) -> bool:
    pure = PurePosixPath(name)
    return not (not name or "\\" in name or "\x00" in name or pure.is_absolute() or os.path.isabs(name)
                or ".." in pure.parts or re.match(r"^[A-Za-z]:", name))


# ── JSON, bounded ─────────────────────────────────────────────────────────────────────────────────────────
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (JSON_MAX_INT_DIGITS + 1))


class _JsonTooLarge(ValueError):
    pass


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > JSON_MAX_INT_DIGITS:
        raise _JsonTooLarge(f"an integer of {len(text.lstrip('-')):,} digits (at most {JSON_MAX_INT_DIGITS})")
    return int(text)


def _refuse_constant(text: str) -> Any:
    raise _JsonTooLarge(f"{text} is not JSON")


def parse_json(data: bytes | str, *, max_depth: int = JSON_MAX_DEPTH) -> Any:
    """``json.loads`` with bounds: nesting at most ``max_depth`` deep, integers of at most
    :data:`JSON_MAX_INT_DIGITS` digits, no ``NaN``/``Infinity``; bytes are UTF-8. Costs one pass over the parsed value.

    Raises:
        ValueError: not UTF-8, not JSON, or beyond a bound (says which).
    """
    if isinstance(data, bytes):
        # UTF-8 only (RFC 8259 for JSON that travels): json.loads would detect UTF-16/32 from the first bytes and
        # import that codec's module while an untrusted file is read (a fuzzed tokenizer.json did)
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 JSON ({exc.reason} at byte {exc.start:,})") from None
    # the bounded-int hook costs a Python call per integer: only when a run of digits could be a long integer
    long_digits = _LONG_DIGITS.search(data.encode("utf-8", "surrogatepass"))
    # no cyclic garbage collection while the containers are built and walked: in a process that has imported torch
    # and transformers each collection scans their objects too, and 4 MiB of nested lists (2 M containers) cost
    # 2.8 s of CPU with it, 0.6 s without (issue 43's bounds probe); JSON makes no cycles
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _parse_bounded(data, max_depth, long_digits is not None)
    finally:
        if collecting:
            gc.enable()


def _parse_bounded(data: bytes | str, max_depth: int, long_digits: bool) -> Any:
    try:
        value = json.loads(data, parse_int=_bounded_int if long_digits else None, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    except _JsonTooLarge as exc:
        raise ValueError(str(exc)) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    # level by level, containers only: a (node, depth) tuple per value cost 1.3 s of CPU for 4 MiB of ``{}``
    # (1.4 M objects; 7.9 s of load + generate at load 7 on 2 cores), this 0.15 s (issue 43's bounds probe)
    level, depth = [value], 1
    while level:
        if depth > max_depth:
            raise ValueError(f"JSON nested deeper than {max_depth} levels")
        below: list[Any] = []
        for node in level:
            if type(node) is dict:
                below.extend(node.values())
            elif type(node) is list:
                below.extend(node)
        level = [node for node in below if type(node) is dict or type(node) is list]
        depth += 1
    return value


