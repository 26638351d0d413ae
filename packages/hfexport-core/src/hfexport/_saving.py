"""Saving an artifact directory without ever losing data.

- A save holds a lock file beside the target (``.<name>.lock``) from the moment it checks the target until the
  artifact is in place, so concurrent saves to one path (threads or processes) are serialized: the second
  sees the first's artifact and, without ``overwrite``, refuses. The lock is an ``flock`` (released by the
  kernel when a process dies, so a crash leaves no stale lock); the file is removed on release.
- Only an hfexport artifact (a directory holding ``export.json``) or an empty directory is ever replaced.
- The replace is one atomic step where the platform has one (Linux ``renameat2(RENAME_EXCHANGE)``: the new
  artifact and the old one swap places, then the old one is removed). Elsewhere, two renames, with the old
  artifact renamed back when the second fails; a save that finds ``.<name>.old`` left by a crash between
  them restores it first.
- The staging directory is created with mode ``0o777`` so that the process umask applies as for any new
  directory (no process-wide ``os.umask`` call, which would race with other threads).
- A full disk (``ENOSPC``/``EDQUOT``) ends in an ``OSError`` naming the path and the bytes needed where they
  are known, with the staging directory removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_TIMEOUT_S", "check_free_space", "check_target", "disk_full_error", "is_disk_full",
           "make_staging", "recover_retired", "replace_directory", "save_lock", "tree_size", "update_manifest"]

# How long a save waits for another save to the same path before giving up.
LOCK_TIMEOUT_S = 600.0
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


def _retired_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


@contextlib.contextmanager
def save_lock(target: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold the save lock of ``target`` (``.<name>.lock`` beside it); wait up to ``timeout`` seconds for it.

    Raises:
        TimeoutError: another save to ``target`` held the lock for ``timeout`` seconds (names its pid).
    """
    timeout = LOCK_TIMEOUT_S if timeout is None else timeout
    lock_path = _lock_path(target)
    deadline = time.monotonic() + timeout
    if fcntl is None:  # pragma: no cover - Windows: an exclusive create, removed on release
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
                break
            except FileExistsError:
                if time.monotonic() > deadline:
                    raise TimeoutError(_busy_message(target, lock_path, timeout)) from None
                time.sleep(0.05)
    else:
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise TimeoutError(_busy_message(target, lock_path, timeout)) from None
                        time.sleep(0.05)
                try:  # the releaser removes the file: the one locked must still be the one at lock_path
                    current = os.path.samestat(os.fstat(fd), os.stat(lock_path))
                except FileNotFoundError:
                    current = False
            except BaseException:
                os.close(fd)
                raise
            if current:
                break
            os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)


def _busy_message(target: Path, lock_path: Path, timeout: float) -> str:
    try:
        holder = f"pid {int(lock_path.read_text().strip())}"
    except (OSError, ValueError):
        holder = "another process or thread"
    return (f"another save to {target} ({holder}) has held {lock_path} for over {timeout:g}s; wait for it to "
            "finish, or remove the lock file if no hfexport process is saving there")


def recover_retired(target: Path, manifest_name: str) -> None:
    """Put back an artifact that a crash between the two renames of an overwrite left at ``.<name>.old``
    (or remove it, when the new artifact was already in place). Call with the save lock held."""
    retired = _retired_path(target)
    if not (retired / manifest_name).is_file():
        return
    if target.exists():
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(retired, target)


def check_target(target: Path, overwrite: bool, manifest_name: str) -> None:
    """Refuse a target that saving would damage: a file, a non-empty directory without ``overwrite``, or a
    non-empty directory that is not an hfexport artifact (even with ``overwrite``)."""
    if not target.exists():
        return
    if not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory")
    if not any(target.iterdir()):
        return
    if not overwrite:
        raise FileExistsError(f"{target} exists and is not empty: choose another directory or pass "
                              "overwrite=True (CLI: --overwrite)")
    if not (target / manifest_name).is_file():
        raise FileExistsError(f"{target} is not an hfexport artifact (it has no {manifest_name}): overwrite only "
                              "replaces an earlier export; choose another directory, or empty this one yourself")


def make_staging(target: Path) -> Path:
    """A new directory beside ``target``, with the permissions a plain ``mkdir`` gives (the umask applies)."""
    for _ in range(100):
        staging = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
        try:
            os.mkdir(staging, 0o777)
        except FileExistsError:
            continue
        return staging
    raise FileExistsError(f"could not create a staging directory beside {target}")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # the filesystem (or kernel) has no exchange: use two renames
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_directory(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``, replacing what is there (checked by :func:`check_target`) in one atomic
    step, or in two renames with the old directory restored when the second fails."""
    if not target.exists():
        os.rename(staging, target)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # staging now holds the old artifact
        return
    retired = _retired_path(target)
    if retired.exists():
        raise FileExistsError(f"{retired} exists and is not an earlier artifact of {target}: move it away first")
    os.rename(target, retired)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(retired, target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def tree_size(path: Path) -> int:
    """Bytes in the files under ``path`` (0 when it is gone)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL


def disk_full_error(target: Path, needed: int | None, written: int) -> OSError:
    """The ``OSError(ENOSPC)`` a save ends in when the disk fills: the path, the bytes needed (at least), the
    bytes free."""
    free = _free_bytes(target.parent)
    need = (f"it needs at least {max(needed or 0, written):,} bytes" if needed or written
            else "the size it needs is not known")
    have = f", {free:,} bytes are free there" if free is not None else ""
    error = OSError(errno.ENOSPC, f"no space left on device saving the artifact to {target}: {need}{have}; "
                                  "nothing was written (free some space, or save elsewhere)", str(target))
    error.bytes_needed = max(needed or 0, written) or None  # type: ignore[attr-defined]
    return error


def check_free_space(target: Path, needed: int | None) -> None:
    """Raise the disk-full ``OSError`` before writing when ``needed`` bytes (a lower bound) do not fit."""
    free = _free_bytes(target.parent)
    if needed and free is not None and free < needed:
        raise disk_full_error(target, needed, 0)


def update_manifest(directory: Path, manifest_name: str, updates: Mapping[str, Any]) -> dict[str, Any]:
    """Set top-level keys of a saved artifact's manifest, atomically (a new file renamed over the old one),
    under the save lock. Returns the new manifest."""
    directory = Path(directory).absolute()
    path = directory / manifest_name
    with save_lock(directory):
        manifest = json.loads(path.read_text())
        manifest.update(updates)
        temporary = directory / f".{manifest_name}.{secrets.token_hex(4)}.partial"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(manifest, indent=2, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            if is_disk_full(exc):
                raise disk_full_error(directory, None, 0) from exc
            raise
    return manifest
