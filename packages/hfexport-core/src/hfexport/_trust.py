"""An artifact is untrusted input when loaded: the checks ``hfexport.load`` makes before any runtime opens it.

- The manifest is validated against its schema: one line per problem (not an object, a missing key, a wrong type).
- Every file it names (``files``, ``files_sha256``, and every ``*_file`` key of a component, at any depth)
  resolves inside the artifact directory: no absolute paths, no ``..``, and symlinks only to files within the
  directory (or, for an artifact in a Hugging Face cache snapshot, into that repository's ``blobs/``).
- Every file's size and SHA-256 match the manifest's ``files_sha256``, checked before any runtime opens it.
- Every file a runner opens is one the manifest names and hashes (:func:`artifact_file`): no default file names.
  A schema-1 manifest (no hashes) is refused unless ``trust_remote_code=True`` (:func:`check_integrity`).
- The manifest is bounded: at most :data:`MANIFEST_MAX_BYTES`, JSON nested at most :data:`JSON_MAX_DEPTH` deep,
  integers of at most :data:`JSON_MAX_INT_DIGITS` digits (:func:`parse_json`); beyond, a :class:`ManifestError`.
- No code runs from it: pytree specs are read by :func:`load_treespec`, hfexport's own reader, which admits only
  the types of :func:`allowed_pytree_type` (builtins containers, and what a tracer allows through
  :func:`allow_pytree_types`), refuses ``defaultdict`` and every context that names a module (an enum), and
  imports nothing. Pickled bytes are unpickled only by a backend's restricted unpickler (``hfexport_dynamo``'s
  ``.pt2`` reader), never by ``torch.load`` with ``weights_only=False``, unless the caller passes
  ``trust_remote_code=True``.

Nothing here imports torch at import time (``hfexport --help`` stays fast).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_NAME = "export.json"
SCHEMA_VERSION = 2  # 2: files_sha256 and components are required (1 is still read)

__all__ = ["HASHES_KEY", "IntegrityError", "MANIFEST_MAX_BYTES", "MANIFEST_MAX_FILES", "MANIFEST_NAME", "ManifestError", "SAFE_PICKLE_GLOBALS", "SCHEMA_VERSION",
           "UntrustedArtifactError", "allow_pytree_types", "allowed_pytree_type", "artifact_bytes", "artifact_file", "check_file_paths", "check_path_bounds", "check_integrity", "check_treespec", "file_digests", "hub_blobs", "open_beneath", "read_beneath",
           "import_type_modules", "importable_prefixes", "load_treespec", "manifest_file_refs", "parse_json", "pickle_globals",
           "read_manifest", "torch_dtype", "treespec_names", "unregistered", "unsafe_pickle_globals",
           "validate_manifest"]

HASHES_KEY = "files_sha256"
MANIFEST_MAX_BYTES = 4 * 2**20  # a generation artifact's manifest is ~100 KB; 4 MiB of small ints parse in ~1 s
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


# ── paths ─────────────────────────────────────────────────────────────────────────────────────────────────
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


def hub_blobs(root: Path) -> Path | None:
    """The ``blobs`` directory of the Hugging Face cache repository whose snapshot holds ``root``
    (``models--org--name/snapshots/<rev>/[subfolder/]``), or ``None``. Only that cache's own ``blobs``: found from the
    snapshot's real path, and refused when it is a symlink (a ``blobs`` linked to ``/`` made every file of the
    artifact a link anywhere on disk, issue 43); no other ancestor's ``blobs`` counts."""
    real = Path(os.path.realpath(root))
    for snapshot in [real, *real.parents]:
        if snapshot.parent.name == "snapshots":
            blobs = snapshot.parent.parent / "blobs"
            try:
                info = os.lstat(blobs)
            except OSError:
                return None
            import stat

            return blobs if stat.S_ISDIR(info.st_mode) else None  # a symlink is not S_ISDIR under lstat
    return None


def _allowed_roots(root: Path) -> list[Path]:
    blobs = hub_blobs(root)
    return [root] + ([blobs] if blobs is not None else [])


class _Refused(ValueError):
    pass


def _walk_open(dir_fd: int, parts: list[str], name: str) -> int:
    """A descriptor of regular file ``parts`` beneath directory descriptor ``dir_fd``, each component opened with
    ``O_NOFOLLOW`` relative to the one before (``openat``): no symlink, no ``..``, nothing but a regular file at
    the end. Raises :class:`_Refused` saying which component is what."""
    import stat

    fd = os.dup(dir_fd)
    try:
        for i, part in enumerate(parts):
            if part in ("", ".", ".."):
                raise _Refused(f"{name!r} has a {part or 'empty'!r} component")
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | (0 if last else os.O_DIRECTORY)
            try:
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(f"{name!r}: {'/'.join(parts[:i + 1])} does not exist") from None
            if stat.S_ISLNK(info.st_mode):
                raise _Refused(f"{name!r} goes through a symlink at {'/'.join(parts[:i + 1])!r}")
            if last and not stat.S_ISREG(info.st_mode):
                raise _Refused(f"{name!r} is not a regular file")
            try:
                next_fd = os.open(part, flags | (os.O_NONBLOCK if last else 0), dir_fd=fd)
            except OSError as exc:  # ELOOP: it became a symlink since the lstat
                raise _Refused(f"{name!r} changed while it was opened ({exc.strerror} at "
                               f"{'/'.join(parts[:i + 1])!r})") from None
            os.close(fd)
            fd = next_fd
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Refused(f"{name!r} is not a regular file")
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(directory: Path, name: str) -> int:
    """A read-only descriptor of file ``name`` (a relative path of ``/``-separated components) inside ``directory``,
    opened by walking from the directory's own descriptor with ``O_NOFOLLOW`` on every component: no component may
    be a symlink or ``..``, and the file must be a regular file. The one exception is a Hugging Face cache snapshot
    (:func:`hub_blobs`): a file of the snapshot that is a symlink to ``../../blobs/<blob>`` (as huggingface_hub lays
    it out, subfolders adding ``../``) is opened as that blob, beneath that cache's own ``blobs`` directory.

    The caller owns the descriptor (close it). Checked with the OS, not by normalising text: a location
    ``a/../model.onnx.data`` where ``a`` is a symlink is refused, where ``os.path.normpath`` made it the hashed name.

    Raises:
        ValueError: a symlink, ``..``, not a regular file (says which component).
        FileNotFoundError: a component is missing.
    """
    import stat

    parts = name.split("/")
    root_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            return _walk_open(root_fd, parts, name)
        except _Refused as refused:
            blobs = hub_blobs(Path(directory))
            if blobs is None or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"{Path(directory) / MANIFEST_NAME} names {refused}: hfexport opens only the "
                                 "artifact directory's own regular files (the artifact is damaged or crafted)") from None
            # a Hub snapshot: the folders are real, the file a link to ../(../)*blobs/<blob>
            parent_fd = _walk_open_dir(root_fd, parts[:-1], name)
            try:
                info = os.stat(parts[-1], dir_fd=parent_fd, follow_symlinks=False)
                target = os.readlink(parts[-1], dir_fd=parent_fd) if stat.S_ISLNK(info.st_mode) else None
            finally:
                os.close(parent_fd)
            # from the link's folder (snapshots/<rev>/[subfolder/][folders/]) up to the repository
            ups = len(Path(os.path.realpath(directory)).relative_to(blobs.parent).parts) + len(parts) - 1
            expected = "../" * ups + "blobs/"
            blob = target[len(expected):] if target and target.startswith(expected) else ""
            if not blob or "/" in blob or blob in (".", ".."):
                raise ValueError(f"{Path(directory) / MANIFEST_NAME} names {refused}, and it is not a link into "
                                 f"this Hugging Face cache's own blobs ({target!r}): the artifact is damaged or "
                                 "crafted") from None
            blobs_fd = os.open(blobs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            try:
                return _walk_open(blobs_fd, [blob], name)
            except _Refused as again:
                raise ValueError(f"{Path(directory) / MANIFEST_NAME} names {again} (in the cache's blobs): the "
                                 "artifact is damaged or crafted") from None
            finally:
                os.close(blobs_fd)
    finally:
        os.close(root_fd)


def _walk_open_dir(dir_fd: int, parts: list[str], name: str) -> int:
    fd = os.dup(dir_fd)
    for part in parts:
        try:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                              dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise ValueError(f"{name!r}: folder {part!r} is not a directory of the artifact ({exc.strerror})") from None
        os.close(fd)
        fd = next_fd
    return fd


def read_beneath(directory: Path, name: str, max_bytes: int | None = None) -> bytes:
    """The bytes of file ``name`` in ``directory``, read from one descriptor that :func:`open_beneath` opened (what
    is hashed is what a runtime is then handed: no path is opened again).

    Raises:
        ValueError: as :func:`open_beneath`; or over ``max_bytes``.
    """
    fd = open_beneath(directory, name)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"{name!r} is {size:,} bytes, over the {max_bytes:,} expected")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 24)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise ValueError(f"{name!r} grew past {max_bytes:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _plain_relative(name: str) -> bool:
    pure = PurePosixPath(name)
    return not (not name or "\\" in name or "\x00" in name or pure.is_absolute() or os.path.isabs(name)
                or ".." in pure.parts or re.match(r"^[A-Za-z]:", name))


def check_path_bounds(where: Any, named: Mapping[str, Any]) -> None:
    """Refuse more than :data:`MANIFEST_MAX_FILES` distinct file names, or a name longer than
    :data:`PATH_MAX_CHARS` characters, of more than :data:`PATH_MAX_PARTS` components, or with a component over
    :data:`PATH_PART_MAX_BYTES` bytes: checked before any of them reaches the file system. The message names the
    bound and the value (and one offending name, cut short), never every name.

    Raises:
        ManifestError: the bound, the value.
    """
    if len(named) > MANIFEST_MAX_FILES:
        raise ManifestError(where, [f"names {len(named):,} files, over the {MANIFEST_MAX_FILES:,} a manifest may "
                                    "name (hfexport._trust.MANIFEST_MAX_FILES): the artifact is damaged or crafted"])
    for name in named:
        parts = name.split("/")
        longest = max((len(p.encode("utf-8", "surrogatepass")) for p in parts), default=0)
        for value, bound, what in ((len(name), PATH_MAX_CHARS, "characters"), (len(parts), PATH_MAX_PARTS,
                                   "path components"), (longest, PATH_PART_MAX_BYTES, "bytes in one component")):
            if value > bound:
                raise ManifestError(where, [f"names a file of {value:,} {what}, over the bound of {bound:,} "
                                            f"({name[:60]!r}...): the artifact is damaged or crafted"])


def check_file_paths(path: Path, manifest: Mapping[str, Any]) -> None:
    """Refuse a manifest that names a file outside ``path``: an absolute path, a ``..`` component, a name that
    is not a plain relative path, or a symlink (anywhere on the way) that leads outside.

    Raises:
        ValueError: the offending names, each with where the manifest gives it.
    """
    root = Path(path).resolve()
    roots = _allowed_roots(root)
    named: dict[str, list[str]] = {}
    for where, name in manifest_file_refs(manifest):
        named.setdefault(name, []).append(where)
    check_path_bounds(Path(path) / MANIFEST_NAME, named)
    bad = []
    for name, wheres in named.items():
        if not _plain_relative(name):
            why = "absolute, '..' or not a plain relative path"
        else:
            try:  # walked with the OS from the directory's descriptor, O_NOFOLLOW on every component
                os.close(open_beneath(root, name))
                continue
            except FileNotFoundError:
                continue  # read_manifest names the missing files
            except ValueError as exc:
                resolved = (root / name).resolve()
                if not str(exc).startswith(str(Path(root) / MANIFEST_NAME)) or any(resolved.is_relative_to(r)
                                                                                  for r in roots):
                    why = str(exc).split(" names ", 1)[-1]
                else:
                    why = f"a symlink to {resolved}"
        bad.append(f"{name!r} ({why}; named by {', '.join(wheres)})")
    if bad:
        raise ValueError(f"{Path(path) / 'export.json'} names files outside the artifact directory {root}: "
                         + "; ".join(bad))


# ── integrity ─────────────────────────────────────────────────────────────────────────────────────────────
def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digests(directory: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"sha256": hex, "size": bytes}}`` of files in ``directory`` (the manifest's ``files_sha256``)."""
    return {name: {"sha256": _sha256(Path(directory) / name), "size": (Path(directory) / name).stat().st_size}
            for name in sorted(set(names))}


def check_integrity(path: Path, manifest: Mapping[str, Any], *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Check every file's size and SHA-256 against ``manifest["files_sha256"]`` (sizes first: a truncated file
    costs no hashing).

    A schema-1 manifest records no hashes: its files cannot be checked, so it is refused unless
    ``trust_remote_code`` (the message says how to re-save it with hashes).

    Returns:
        ``{"files": n, "bytes": total}`` of what was checked (``{"files": 0, ...}`` for a trusted version-1
        manifest).

    Raises:
        IntegrityError: the files that differ, each with expected and actual size or SHA-256.
        UntrustedArtifactError: a schema-1 manifest without ``trust_remote_code``.
    """
    if HASHES_KEY not in manifest and not trust_remote_code:
        raise UntrustedArtifactError(
            f"{path} has a schema-{manifest.get('schema_version', 1)} manifest, which records no file hashes: "
            "hfexport cannot check what its runtime would read. If you trust its source, re-save it with hashes: "
            f"hfexport.load({str(path)!r}, trust_remote_code=True).save_pretrained(NEW_DIR) (CLI: hfexport verify "
            "DIR --trust-remote-code, then load and save it in Python)")
    hashes = manifest.get(HASHES_KEY) or {}
    problems, bad = [], []
    for name, entry in sorted(hashes.items()):
        try:
            size = (Path(path) / name).stat().st_size
        except FileNotFoundError:
            problems.append(f"{name}: missing")
            bad.append(name)
            continue
        if size != entry["size"]:
            problems.append(f"{name}: {size:,} bytes where the manifest recorded {entry['size']:,}")
            bad.append(name)
    for name, entry in sorted(hashes.items()):
        if name in bad:
            continue
        fd = open_beneath(Path(path), name)  # the same walk a runner's read takes (artifact_bytes)
        try:
            digest = hashlib.sha256()
            for block in iter(functools.partial(os.read, fd, 1 << 20), b""):
                digest.update(block)
        finally:
            os.close(fd)
        actual = digest.hexdigest()
        if actual != entry["sha256"]:
            problems.append(f"{name}: SHA-256 {actual[:16]}… where the manifest recorded {entry['sha256'][:16]}…")
            bad.append(name)
    if problems:
        raise IntegrityError(f"{path} is corrupt or was modified after it was saved: {'; '.join(problems)} "
                             "(re-export it, or copy it again from its source)", bad)
    return {"files": len(hashes), "bytes": sum(e["size"] for e in hashes.values())}


def artifact_file(path: Path, manifest: Mapping[str, Any], name: Any, where: str) -> Path:
    """The path of file ``name`` that a runner is about to open, after checking that the manifest hashes it
    (``files_sha256``; ``files`` for a schema-1 manifest loaded with ``trust_remote_code``): a runner takes its
    file names from the manifest only, never a default, so every byte it reads was checked on load.

    Args:
        path: the artifact directory.
        manifest: its manifest (read by :func:`read_manifest`, checked by :func:`check_integrity`).
        name: the file name the manifest gives (``None`` when the key is absent).
        where: the manifest key that gives it (``components['model'].onnx.model_file``), for the message.

    Raises:
        ManifestError: no name, or a name the manifest does not hash (the artifact is damaged or crafted).
    """
    hashed = manifest.get(HASHES_KEY)
    known = hashed if isinstance(hashed, dict) else [f for f in manifest.get("files") or [] if isinstance(f, str)]
    if not isinstance(name, str) or not name:
        raise ManifestError(Path(path) / MANIFEST_NAME, [f"{where} names no file ({name!r}): the runtime would need "
                                                         "a default file name; the artifact is damaged or crafted"])
    if name not in known or name == MANIFEST_NAME:
        raise ManifestError(Path(path) / MANIFEST_NAME, [f"{where} names {name!r}, which {HASHES_KEY} does not "
                                                         "hash: the artifact is damaged or crafted"])
    return Path(path) / name


_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (JSON_MAX_INT_DIGITS + 1))


def artifact_bytes(path: Path, manifest: Mapping[str, Any], name: Any, where: str) -> bytes:
    """The bytes of file ``name`` that a runner hands its runtime, read once from a descriptor
    (:func:`read_beneath`: ``O_NOFOLLOW`` on every component, a regular file) and checked against the manifest's
    size and SHA-256 on those very bytes: the runtime gets what was hashed, and no path is opened again (a file
    swapped between a check by path and the runtime's own open changed outputs silently, or crashed the process,
    issue 43). A schema-1 manifest loaded with ``trust_remote_code`` records no hash: its bytes are handed as read.

    Raises:
        ManifestError: as :func:`artifact_file` (a name the manifest does not hash).
        IntegrityError: the bytes differ from the manifest's size or SHA-256 (the file changed since it was checked).
        ValueError: as :func:`open_beneath`.
    """
    artifact_file(path, manifest, name, where)
    hashes = manifest.get(HASHES_KEY)
    entry = hashes.get(name) if isinstance(hashes, dict) else None
    data = read_beneath(Path(path), name, max_bytes=entry["size"] if isinstance(entry, dict) else None)
    if isinstance(entry, dict):
        actual = hashlib.sha256(data).hexdigest()
        if len(data) != entry["size"] or actual != entry["sha256"]:
            raise IntegrityError(f"{Path(path) / name} changed while it was loaded: {len(data):,} bytes of SHA-256 "
                                 f"{actual[:16]}… where the manifest recorded {entry['size']:,} of "
                                 f"{entry['sha256'][:16]}… (another process writes the artifact's directory: load "
                                 "it again once nothing does)", [name])
    return data


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
    :data:`JSON_MAX_INT_DIGITS` digits, no ``NaN``/``Infinity``. Costs one pass over the parsed value.

    Raises:
        ValueError: not JSON, or beyond a bound (says which).
    """
    # the bounded-int hook costs a Python call per integer: only when a run of digits could be a long integer
    long_digits = _LONG_DIGITS.search(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    try:
        value = json.loads(data, parse_int=_bounded_int if long_digits else None, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    except _JsonTooLarge as exc:
        raise ValueError(str(exc)) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    todo = [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > max_depth:
            raise ValueError(f"JSON nested deeper than {max_depth} levels")
        if isinstance(node, dict):
            todo.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            todo.extend((v, depth + 1) for v in node)
    return value


# ── pytree specs: hfexport's own reader, allow-listed types, no import by name ──────────────────────────
_BUILTIN_PYTREE_TYPES = {"builtins.tuple": tuple, "builtins.list": list, "builtins.dict": dict}
_PYTREE_PREDICATES: list[Any] = []
TREESPEC_MAX_NODES = 100_000


def torch_dtype(name: Any) -> Any:
    """The ``torch.dtype`` that ``name`` names (``"float32"``, ``"torch.float32"``), or ``None``: looked up among the
    dtypes torch defines, never with ``getattr(torch, name)``, whose module ``__getattr__`` imports the submodule a
    name such as ``"onnx"`` or ``"_inductor"`` names. A dtype in a manifest or a spec is the artifact's text."""
    return _torch_dtypes().get(name.removeprefix("torch.")) if isinstance(name, str) else None


def _torch_dtypes() -> dict[str, Any]:
    import torch

    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        _TORCH_DTYPES = {key: value for key, value in vars(torch).items() if isinstance(value, torch.dtype)}
    return _TORCH_DTYPES


_TORCH_DTYPES: dict[str, Any] | None = None


def allow_pytree_types(predicate: Any) -> None:
    """Admit the registered pytree types for which ``predicate(cls)`` is true in artifacts' specs (a tracer's
    allow-list: transformers' ``ModelOutput`` subclasses and cache types). Nothing is imported to find them: a type
    is admitted only when it is already registered in this process."""
    if predicate not in _PYTREE_PREDICATES:
        _PYTREE_PREDICATES.append(predicate)


def allowed_pytree_type(name: Any) -> type | None:
    """The Python type a serialized pytree type name stands for, when the allow-list admits it: ``tuple``,
    ``list``, ``dict``, ``collections.OrderedDict``, and registered types a tracer admits
    (:func:`allow_pytree_types`). ``None`` otherwise (``collections.defaultdict`` included: its context names a
    module that torch imports)."""
    if not isinstance(name, str):
        return None
    if name in _BUILTIN_PYTREE_TYPES:
        return _BUILTIN_PYTREE_TYPES[name]
    if name == "collections.OrderedDict":
        import collections

        return collections.OrderedDict
    pytree = sys.modules.get("torch.utils._pytree")
    cls = getattr(pytree, "SERIALIZED_TYPE_TO_PYTHON_TYPE", {}).get(name) if pytree is not None else None
    if isinstance(cls, type) and any(_safe_predicate(p, cls) for p in _PYTREE_PREDICATES):
        return cls
    return None


def _safe_predicate(predicate: Any, cls: type) -> bool:
    try:
        return bool(predicate(cls))
    except Exception:  # noqa: BLE001 - a predicate that fails admits nothing
        return False


def _plain_json(value: Any) -> bool:
    """JSON of strings, numbers, booleans, null and lists of them (a context naming no module or callable)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_plain_json(v) for v in value)
    return False


def load_treespec(spec: Any, where: str) -> Any:
    """Read a ``treespec_dumps`` string with hfexport's own reader: every type admitted by
    :func:`allowed_pytree_type`, every context plain JSON (no object, so no ``__enum__`` that names a module), or
    the type's own ``from_dumpable_context`` for a tracer's types; nothing imported, at most
    :data:`TREESPEC_MAX_NODES` nodes.

    Raises:
        UntrustedArtifactError: a type outside the allow-list, or a context that names a module or callable.
        ValueError: not a serialized pytree spec.
    """
    import torch.utils._pytree as pytree

    if not isinstance(spec, str):
        raise ValueError(f"{where} is not a serialized pytree spec: {spec!r:.80}")
    try:
        protocol, schema = parse_json(spec, max_depth=2 * JSON_MAX_DEPTH)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} is not a serialized pytree spec: {exc} (the depth limit is "
                         f"hfexport._trust.JSON_MAX_DEPTH={JSON_MAX_DEPTH} nodes): the artifact is damaged or "
                         "crafted") from None
    if protocol != 1:
        raise ValueError(f"{where} is a pytree spec of protocol {protocol!r}; hfexport reads protocol 1")
    count = 0

    def build(node: Any) -> Any:
        nonlocal count
        count += 1
        if count > TREESPEC_MAX_NODES:
            raise ValueError(f"{where} has more than {TREESPEC_MAX_NODES:,} nodes")
        if not isinstance(node, dict) or not isinstance(node.get("children_spec"), list):
            raise ValueError(f"{where} is not a serialized pytree spec")
        name, context, children = node.get("type"), node.get("context"), node["children_spec"]
        if name is None and context is None and not children:
            return pytree._LEAF_SPEC if hasattr(pytree, "_LEAF_SPEC") else pytree.LeafSpec()
        cls = allowed_pytree_type(name)
        if cls is None:
            raise UntrustedArtifactError(
                f"{where} names pytree type {name!r:.120}, which hfexport does not admit from an artifact (it admits "
                "tuple, list, dict, OrderedDict and the types its tracer allows; defaultdict and namedtuple name a "
                "module or class): import and register it before hfexport.load, or pass trust_remote_code=True")
        if not isinstance(context, str):
            raise ValueError(f"{where}: the context of a {name} node is not a string")
        node_def = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        if node_def is not None and node_def.from_dumpable_context is not None and cls not in (dict, list, tuple):
            value = node_def.from_dumpable_context(context)
        else:
            try:
                value = parse_json(context)
            except ValueError as exc:
                raise ValueError(f"{where}: the context of a {name} node: {exc}") from None
            if not _plain_json(value):
                raise UntrustedArtifactError(f"{where}: the context of a {name} node is {context!r:.120}, which is not "
                                             "plain JSON (an enum names a module that reading it would import)")
            if cls in (dict,) or name == "collections.OrderedDict" or cls not in (tuple, list):
                if not isinstance(value, list) or len(value) != len(children):
                    raise ValueError(f"{where}: the keys of a {name} node do not match its children")
        return pytree.TreeSpec(cls, value, [build(child) for child in children])

    try:
        return build(schema)
    except RecursionError:
        raise ValueError(f"{where} is nested deeper than Python's recursion allows (hfexport reads at most "
                         f"{JSON_MAX_DEPTH} levels of a spec): the artifact is damaged or crafted") from None


# ── output specs: only registered pytree types, no import by name ───────────────────────────────────────
def treespec_names(spec: str) -> tuple[set[str], set[str]]:
    """The serialized type names and the enum modules (``"__enum__"`` contexts) of a ``treespec_dumps`` string.

    Raises:
        ValueError: not a treespec string.
    """
    try:  # bounded: a spec nested 100,000 deep raised a bare RecursionError from json (issue 43)
        protocol, schema = parse_json(spec, max_depth=2 * JSON_MAX_DEPTH)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a serialized pytree spec ({exc}): {spec!r:.80}") from None
    types: set[str] = set()
    enums: set[str] = set()

    def context_enums(value: Any) -> None:
        if isinstance(value, dict):
            if "__enum__" in value:
                enums.add(str(value.get("fqn", "")).partition(":")[0])
            for v in value.values():
                context_enums(v)
        elif isinstance(value, list):
            for v in value:
                context_enums(v)

    todo = [schema]
    while todo:  # no recursion: the depth is bounded above, but the walk needs no stack either
        node = todo.pop()
        if not isinstance(node, dict):
            raise ValueError(f"not a serialized pytree spec: {spec!r:.80}")
        if node.get("type") is not None:
            types.add(str(node["type"]))
        context = node.get("context")
        if isinstance(context, str):
            try:
                context_enums(parse_json(context))
            except ValueError:
                pass
        children = node.get("children_spec") or []
        todo.extend(children if isinstance(children, list) else [])
    return types, enums


def unregistered(types: Iterable[str]) -> list[str]:
    """The serialized type names that are not registered pytree nodes in this process."""
    import torch.utils._pytree as pytree

    return sorted(t for t in types if t not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE)


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def importable_prefixes(type_name: str) -> list[str]:
    """The module names a serialized type name may live in, longest first (``a.b.C.D`` -> ``a.b.C``, ``a.b``,
    ``a``); empty for a name that is not a dotted identifier."""
    if not _DOTTED.fullmatch(type_name):
        return []
    parts = type_name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def import_type_modules(type_names: Iterable[str], allowed: Any = None) -> list[str]:
    """Import the module each serialized type name lives in (its pytree registration runs on import).

    Args:
        type_names: serialized type names (``transformers.modeling_outputs.BaseModelOutput``).
        allowed: ``allowed(module) -> bool``: only such modules are imported (default: any; callers without
            the user's ``trust_remote_code`` pass an allow-list).

    Returns:
        The modules imported.
    """
    import importlib
    import importlib.util

    imported = []
    for name in type_names:
        for module in importable_prefixes(name):
            if allowed is not None and not allowed(module):
                continue
            try:
                if module not in sys.modules and importlib.util.find_spec(module) is None:
                    continue
                importlib.import_module(module)
            except (ImportError, ValueError):
                continue
            imported.append(module)
            break
    return imported


def check_treespec(spec: str, where: str) -> None:
    """Refuse an output spec that names a type that is not a registered pytree node, or an enum of a module that
    is not imported: reading it would need an import by a name the artifact gives.

    Raises:
        UntrustedArtifactError: the names, and how to make them loadable.
    """
    load_treespec(spec, where)


# ── pickles, read without unpickling ──────────────────────────────────────────────────────────────────────
_STORAGES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool", "ComplexFloat",
             "ComplexDouble", "QUInt8", "QInt8", "QInt32", "QUInt4x2", "QUInt2x4")
_DTYPES = ("float32", "float", "float64", "double", "float16", "half", "bfloat16", "complex32", "chalf", "complex64",
           "cfloat", "complex128", "cdouble", "uint8", "int8", "int16", "short", "int32", "int", "int64", "long",
           "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
           "float8_e5m2fnuz", "float8_e8m0fnu", "qint8", "quint8", "qint32", "quint4x2", "quint2x4")
# What ``torch.save`` writes for tensors, parameters and containers of them (measured): tensor rebuilders, typed
# storages (loaded through torch's persistent ids), dtypes, devices, sizes, and a few plain containers.
SAFE_PICKLE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [("collections", "OrderedDict"),
     ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
     ("torch", "Size"), ("torch", "device")]
    + [("torch", f"{s}Storage") for s in _STORAGES] + [("torch", d) for d in _DTYPES]
    + [(m, n) for m in ("builtins", "__builtin__") for n in ("set", "frozenset", "slice")])

_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_UNKNOWN = object()


def _stream_globals(data: bytes, start: int) -> tuple[list[tuple[str, str]], int]:
    """The globals one pickle (starting at ``start``) loads, and where it ends. Raises ValueError if malformed
    or if a global's name cannot be read statically (``STACK_GLOBAL`` of computed strings, extension codes)."""
    import io
    import pickletools

    found: list[tuple[str, str]] = []
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[Any, Any] = {}
    stream = io.BytesIO(data)
    stream.seek(start)
    end = start
    try:
        for op, arg, pos in pickletools.genops(stream):
            name = op.name
            if name in ("EXT1", "EXT2", "EXT4"):
                raise ValueError(f"opcode {name} at byte {pos} loads a global through the copyreg extension registry")
            if name in ("GLOBAL", "INST"):
                module, _, qualname = str(arg).partition(" ")
                found.append((module, qualname))
            if name in _STRING_OPS:
                stack.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(arg, _UNKNOWN))
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "STACK_GLOBAL":
                qualname, module = stack.pop(), stack.pop()
                if not isinstance(module, str) or not isinstance(qualname, str):
                    raise ValueError(f"STACK_GLOBAL at byte {pos} loads a global whose name is computed")
                found.append((module, qualname))
                stack.append(_UNKNOWN)
            else:
                before = op.stack_before
                if pickletools.markobject in before:
                    if not marks:
                        raise ValueError(f"{name} at byte {pos} without a MARK")
                    del stack[marks.pop():]
                    count = before.index(pickletools.markobject)
                else:
                    count = len(before)
                if count > len(stack):
                    raise ValueError(f"{name} at byte {pos} pops more than the stack holds")
                if count:
                    del stack[-count:]
                stack.extend(_UNKNOWN for _ in op.stack_after)
            end = pos
            if name == "STOP":
                return found, stream.tell()
    except (IndexError, KeyError) as exc:
        raise ValueError(f"malformed pickle near byte {end}: {exc!r}") from exc
    raise ValueError("pickle without STOP")


def pickle_globals(data: bytes) -> list[tuple[str, str]]:
    """Every ``(module, name)`` global that unpickling ``data`` would import, read with ``pickletools`` (nothing
    is unpickled). ``data`` may hold several pickles back to back.

    Raises:
        ValueError: malformed, trailing bytes that are not a pickle, or a global whose name only unpickling
            could tell (``STACK_GLOBAL`` of computed strings, copyreg extension codes).
    """
    found: list[tuple[str, str]] = []
    position = 0
    while position < len(data):
        try:
            more, position = _stream_globals(data, position)
        except ValueError:
            raise
        except Exception as exc:  # pickletools raises ValueError mostly, but also others on garbage
            raise ValueError(f"not a pickle at byte {position}: {exc}") from exc
        found += more
    if not data:
        raise ValueError("empty pickle")
    return found


def unsafe_pickle_globals(data: bytes, allowed: frozenset[tuple[str, str]] = SAFE_PICKLE_GLOBALS) -> list[str]:
    """The globals of ``data`` outside ``allowed`` (``"module.name"``), or the reason it cannot be read."""
    try:
        found = pickle_globals(data)
    except ValueError as exc:
        return [f"(unreadable pickle: {exc})"]
    return sorted({f"{m}.{n}" for m, n in found if (m, n) not in allowed})


def read_manifest(path: Path, *, check_present: bool = True) -> dict[str, Any]:
    """Read ``path/export.json`` and check it as untrusted input (see :mod:`hfexport._trust`): valid JSON, the
    schema (one line per problem), every file it names (``files``, ``files_sha256``, each component's
    ``*_file`` keys) a plain relative path that resolves inside ``path`` (symlinks included), and present.

    File contents are not read here: :func:`hfexport._trust.check_integrity` checks sizes and SHA-256. With
    ``check_present=False`` the files need not exist yet (a Hub download checks the manifest before fetching them).

    Raises:
        FileNotFoundError: no manifest, or a file it names is missing.
        hfexport.ManifestError: not JSON, not an object, a missing key, a wrong type, another schema version.
        ValueError: a file named outside ``path`` (absolute, ``..``, or a symlink that leads out).
    """
    path = Path(path)
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path} is not an hfexport artifact: it has no {MANIFEST_NAME}")
    size = manifest_path.stat().st_size
    if size > MANIFEST_MAX_BYTES:
        raise ManifestError(manifest_path, [f"{size:,} bytes, over the {MANIFEST_MAX_BYTES:,} a manifest may have: "
                                            "the artifact is damaged or crafted"])
    try:
        manifest = parse_json(manifest_path.read_bytes())
    except ValueError as exc:
        raise ManifestError(manifest_path, [f"{exc}: the artifact is damaged or crafted"]) from None
    validate_manifest(manifest, manifest_path, supported=range(1, SCHEMA_VERSION + 1))
    check_file_paths(path, manifest)
    missing = sorted({name for _, name in manifest_file_refs(manifest) if not (path / name).is_file()})
    if missing and check_present:
        raise FileNotFoundError(f"{path} lacks files its manifest names: {missing}")
    return manifest
