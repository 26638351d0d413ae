"""Crafting artifacts as an attacker would: rewrite files of a saved artifact, then rewrite ``files_sha256`` (an
attacker controls the whole directory). Shared by the untrusted-input tests of every backend."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def copy_artifact(source: Path, tmp_path: Path, name: str = "artifact") -> Path:
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


def manifest_of(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "export.json").read_text())


def write_manifest(directory: Path, manifest: Any) -> None:
    (directory / "export.json").write_text(json.dumps(manifest))


def rehash(directory: Path) -> None:
    """Record the current files' sizes and SHA-256 in the manifest."""
    manifest = manifest_of(directory)
    manifest["files_sha256"] = {name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
                                       "size": (directory / name).stat().st_size}
                                for name in manifest.get("files_sha256", {})}
    write_manifest(directory, manifest)


def rewrite_zip(file: Path, edit: Callable[[list[tuple[str, bytes]]], list[tuple[str, bytes]]],
                compression: int = zipfile.ZIP_STORED) -> None:
    """Rewrite a zip archive (a .pt2): ``edit`` maps the ``(member name, bytes)`` list to the new one (names may
    repeat: ``zipfile`` writes duplicates with a warning)."""
    with zipfile.ZipFile(file) as source:
        members = [(info.filename, source.read(info)) for info in source.infolist()]
    buffer = io.BytesIO()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name"
        with zipfile.ZipFile(buffer, "w", compression) as target:
            for name, data in edit(members):
                target.writestr(name, data)
    file.write_bytes(buffer.getvalue())
