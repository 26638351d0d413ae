"""An artifact's files as untrusted input (see :mod:`hfexport._trust` for the whole list of checks): ``export.json``
read and checked (:func:`read_manifest`), every file it names resolved inside the artifact directory
(:func:`check_file_paths`) and opened by descriptor, ``O_NOFOLLOW`` on every component (:func:`open_beneath`,
:func:`read_beneath`; a Hugging Face cache snapshot's links into its own ``blobs``, :func:`hub_blobs`), and every
file's size and SHA-256 checked against the manifest (:func:`check_integrity`, :func:`artifact_file`,
:func:`artifact_bytes`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import io
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ._trust import (
    HASHES_KEY,
    MANIFEST_MAX_BYTES,
    MANIFEST_MAX_FILES,
    MANIFEST_NAME,
    PATH_MAX_CHARS,
    PATH_MAX_PARTS,
    PATH_PART_MAX_BYTES,
    SCHEMA_VERSION,
    IntegrityError,
    ManifestError,
    UntrustedArtifactError,
    _plain_relative,
    manifest_file_refs,
    parse_json,
    validate_manifest,
)

__all__ = ["artifact_bytes", "artifact_descriptor", "artifact_file", "check_file_paths", "check_integrity", "check_path_bounds",
           "checked_on_read", "descriptor_path",
           "file_digests", "hub_blobs", "open_beneath", "read_beneath", "read_manifest"]


# ── opening a file beneath the artifact directory, by descriptor ──────────────────────────────────────────
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


class FileTooLargeError(ValueError):
    """A file read by :func:`read_beneath` is larger than ``max_bytes``: a bound, or the size the manifest
    recorded (then the file changed since it was written, and :func:`artifact_bytes` says so)."""


def read_beneath(directory: Path, name: str, max_bytes: int | None = None, *,
                 writable: bool = False) -> bytes | bytearray:
    """The bytes of file ``name`` in ``directory``, read from one descriptor that :func:`open_beneath` opened (what
    is hashed is what a runtime is then handed: no path is opened again).

    The file is read into one buffer of its size, filled in place, never into chunks joined afterwards (a transient
    second copy of the whole file, issue 44): ``bytes`` by default (one ``read`` of the whole file; Linux reads at
    most 2 GiB in a call, so a larger file is still read in chunks and joined), or with ``writable`` a
    ``bytearray`` of any size that tensors can be built on without a copy (``torch.frombuffer``).

    Raises:
        ValueError: as :func:`open_beneath`.
        FileTooLargeError: over ``max_bytes`` (a ``ValueError``).
    """
    fd = open_beneath(directory, name)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise FileTooLargeError(f"{name!r} is {size:,} bytes, over the {max_bytes:,} expected")
        buffer, total = bytearray(size if writable else 0), 0
        with memoryview(buffer) as view, io.FileIO(fd, closefd=False) as file:
            while total < len(buffer):
                count = file.readinto(view[total:])
                if not count:
                    break
                total += count
        del buffer[total:]  # a file that shrank while it was read: the caller's hash check says so
        chunks: list[bytes | bytearray] = [buffer] if writable else []
        while True:  # the rest, or the whole file in one read (one bytes object), then anything it grew by
            chunk = os.read(fd, size + 1 if not chunks else 1 << 24)
            if not chunk:
                break
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise FileTooLargeError(f"{name!r} grew past {max_bytes:,} bytes while it was read")
            if writable:
                buffer += chunk
            else:
                chunks.append(chunk)
        return buffer if writable else b"".join(chunks)  # of one chunk: that object, not a copy
    finally:
        os.close(fd)


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


# Files whose SHA-256 check_integrity left to artifact_bytes (checked_on_read): {(directory, name): read yet}
_DEFERRED: contextvars.ContextVar[dict[tuple[str, str], bool] | None] = contextvars.ContextVar("hfexport_deferred",
                                                                                              default=None)


@contextlib.contextmanager
def checked_on_read(path: Path, manifest: Mapping[str, Any], names: Iterable[str]) -> Iterator[None]:
    """Within this block, :func:`artifact_bytes` is the SHA-256 check of ``names`` (which :func:`check_integrity`
    was told to ``defer``): a mismatch there reads as check_integrity's ("corrupt or was modified after it was
    saved"). On leaving it, a deferred file that no runner read is hashed then, as check_integrity would have."""
    state = {(str(path), name): False for name in names}
    token = _DEFERRED.set(state)
    try:
        yield
    finally:
        _DEFERRED.reset(token)
    unread = [name for (_, name), read in state.items() if not read]
    if unread:
        hashes = manifest.get(HASHES_KEY) or {}
        check_integrity(path, {HASHES_KEY: {name: hashes[name] for name in unread if name in hashes}})


def check_integrity(path: Path, manifest: Mapping[str, Any], *, trust_remote_code: bool = False,
                    defer: Iterable[str] = ()) -> dict[str, Any]:
    """Check every file's size and SHA-256 against ``manifest["files_sha256"]`` (sizes first: a truncated file
    costs no hashing). The files in ``defer`` have their sizes checked only: their SHA-256 is checked where they
    are read (:func:`artifact_bytes`, within :func:`checked_on_read`), on the bytes the runtime gets, so that each
    is read and hashed once.

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
    deferred = set(defer)
    for name, entry in sorted(hashes.items()):
        if name in bad or name in deferred:
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


def artifact_bytes(path: Path, manifest: Mapping[str, Any], name: Any, where: str, *,
                   writable: bool = False) -> bytes | bytearray:
    """The bytes of file ``name`` that a runner hands its runtime, read once from a descriptor
    (:func:`read_beneath`: ``O_NOFOLLOW`` on every component, a regular file) and checked against the manifest's
    size and SHA-256 on those very bytes: the runtime gets what was hashed, and no path is opened again (a file
    swapped between a check by path and the runtime's own open changed outputs silently, or crashed the process,
    issue 43). A schema-1 manifest loaded with ``trust_remote_code`` records no hash: its bytes are handed as read.
    With ``writable``, a ``bytearray`` (:func:`read_beneath`): a runtime may build its tensors on those bytes
    without copying them.

    Raises:
        ManifestError: as :func:`artifact_file` (a name the manifest does not hash).
        IntegrityError: the bytes differ from the manifest's size or SHA-256 (the file changed since it was checked).
        ValueError: as :func:`open_beneath`.
    """
    artifact_file(path, manifest, name, where)
    hashes = manifest.get(HASHES_KEY)
    entry = hashes.get(name) if isinstance(hashes, dict) else None
    try:
        data = read_beneath(Path(path), name, max_bytes=entry["size"] if isinstance(entry, dict) else None,
                            writable=writable)
    except FileTooLargeError as error:  # it grew after the check: a concurrent writer, not a bound
        raise IntegrityError(f"{Path(path) / name} changed while it was loaded: {error}, the size the manifest "
                             f"recorded {_AGAIN}", [name]) from None
    if isinstance(entry, dict):
        _check_read(path, name, entry, len(data), hashlib.sha256(data).hexdigest())
    return data


_AGAIN = "(another process writes the artifact's directory: load it again once nothing does)"


def _check_read(path: Path, name: str, entry: Mapping[str, Any], size: int, actual: str) -> None:
    """Refuse a file read for a runner whose ``size`` or SHA-256 ``actual`` differs from the manifest's ``entry``;
    within :func:`checked_on_read`, this is check_integrity's check of the file (and counts as done)."""
    deferred = _DEFERRED.get()
    key = (str(path), name)
    if deferred is not None and key in deferred and not deferred[key]:  # check_integrity's hash, done here
        if size != entry["size"] or actual != entry["sha256"]:
            problem = (f"{size:,} bytes where the manifest recorded {entry['size']:,}" if size != entry["size"] else
                       f"SHA-256 {actual[:16]}… where the manifest recorded {entry['sha256'][:16]}…")
            # one read, one check: whether the file differed at rest or changed during the load is not known
            raise IntegrityError(f"{path} is corrupt or was modified after it was saved: {name}: {problem}; "
                                 f"{Path(path) / name} changed while it was loaded or before (re-export it, or "
                                 f"copy it again from its source; {_AGAIN.strip('()')})", [name])
        deferred[key] = True
    if size != entry["size"] or actual != entry["sha256"]:
        raise IntegrityError(f"{Path(path) / name} changed while it was loaded: {size:,} bytes of SHA-256 "
                             f"{actual[:16]}… where the manifest recorded {entry['size']:,} of "
                             f"{entry['sha256'][:16]}… {_AGAIN}", [name])


def artifact_descriptor(path: Path, manifest: Mapping[str, Any], name: Any, where: str) -> int:
    """A read-only descriptor of file ``name`` (:func:`open_beneath`), whose bytes were hashed from that very
    descriptor and checked against the manifest's size and SHA-256, for a runtime whose API takes a path and maps
    the file (ExecuTorch's ``.ptd``): hand it :func:`descriptor_path`, which names the open file, not the directory
    entry, so a file swapped in after the check (a rename over ``name``) is not what the runtime reads. A write into
    the same file in place after the check is not detected (the runtime maps the file; see the guide's trust
    section). The caller owns the descriptor (close it after the runtime has let go of the file).

    Raises:
        as :func:`artifact_bytes`.
    """
    artifact_file(path, manifest, name, where)
    hashes = manifest.get(HASHES_KEY)
    entry = hashes.get(name) if isinstance(hashes, dict) else None
    fd = open_beneath(Path(path), name)
    try:
        if isinstance(entry, dict):
            digest, size = hashlib.sha256(), 0
            while block := os.pread(fd, 1 << 20, size):
                size += len(block)
                if size > entry["size"]:  # it grew after the check: a concurrent writer, not a bound
                    raise IntegrityError(f"{Path(path) / name} changed while it was loaded: it grew past the "
                                         f"{entry['size']:,} bytes the manifest recorded {_AGAIN}", [name])
                digest.update(block)
            _check_read(path, name, entry, size, digest.hexdigest())
    except BaseException:
        os.close(fd)
        raise
    return fd


def descriptor_path(fd: int) -> str:
    """A path that opens the file open at ``fd`` itself, whatever its directory entry now names: Linux's
    ``/proc/self/fd/N`` (a reopen of the same inode, even once renamed over or unlinked), elsewhere ``/dev/fd/N``
    (macOS and the BSDs: a duplicate of the descriptor)."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"


# ── export.json, read and checked ─────────────────────────────────────────────────────────────────────────
def read_manifest(path: Path, *, check_present: bool = True) -> dict[str, Any]:
    """Read ``path/export.json`` and check it as untrusted input (see :mod:`hfexport._trust`): valid JSON, the
    schema (one line per problem), every file it names (``files``, ``files_sha256``, each component's
    ``*_file`` keys) a plain relative path that resolves inside ``path`` (symlinks included), and present.

    File contents are not read here: :func:`check_integrity` checks sizes and SHA-256. With
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
