"""A ``.pte`` is read as untrusted input: a corrupt program (re-hashed, as an attacker would) is an
``IntegrityError`` naming the file, not the runtime's ``Failed to load program, error: 0x23``; the runner opens
only files the manifest names and hashes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from crafting import copy_artifact, manifest_of, rehash, write_manifest

import hfexport
from helpers import TinyMLP
from hfexport import IntegrityError, ManifestError

pytest.importorskip("executorch")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("pte-untrusted")
    x = torch.randn(2, 8)
    return {"x": x, "dir": hfexport.export(TinyMLP().eval(), {"x": x}, backend="executorch-xnnpack"
                                           ).save_pretrained(base / "mlp")}


@pytest.mark.parametrize("how", ["truncated", "garbage", "header"])
def test_corrupt_pte_is_an_integrity_error_naming_the_file(saved: dict[str, Any], tmp_path: Path, how: str) -> None:
    artifact = copy_artifact(saved["dir"], tmp_path)
    data = bytearray((artifact / "model.pte").read_bytes())
    if how == "truncated":
        data = data[: len(data) // 3]
    elif how == "garbage":
        data[8: len(data) // 2] = bytes((i * 131 + 7) % 256 for i in range(8, len(data) // 2))
    else:
        data[:16] = b"\xff" * 16
    (artifact / "model.pte").write_bytes(bytes(data))
    rehash(artifact)
    with pytest.raises(IntegrityError, match="model.pte") as info:
        hfexport.load(artifact)(x=saved["x"])
    assert info.value.files == ["model.pte"]


def test_pte_runner_takes_file_names_from_the_manifest_only(saved: dict[str, Any], tmp_path: Path) -> None:
    artifact = copy_artifact(saved["dir"], tmp_path)
    manifest = manifest_of(artifact)
    section = manifest["components"]["model"]
    section.get("executorch", {}).pop("program_file", None)
    section.pop("program_file", None)  # the runner used to fall back to model.pte
    write_manifest(artifact, manifest)
    with pytest.raises(ManifestError, match="program_file names no file"):
        hfexport.load(artifact)
