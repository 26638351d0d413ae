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


def swap_after_check(monkeypatch: Any, file: Path, replacement: Path) -> None:
    """Make ``hfexport.load`` meet a concurrent writer at its worst moment: right after ``check_integrity`` hashed
    the files, ``file`` is replaced (``os.replace``, as a writer in a shared directory would) by a copy of
    ``replacement``. A loader that reopens the path hands its runtime the new bytes; one that hands over the bytes
    it checked raises ``IntegrityError`` (or runs what was checked)."""
    import os

    import hfexport._api as api

    original = api.check_integrity

    def check_then_swap(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        staged = file.with_name(file.name + ".swap")
        shutil.copyfile(replacement, staged)
        os.replace(staged, file)
        return result

    monkeypatch.setattr(api, "check_integrity", check_then_swap)


def concurrent_swaps(file: Path, replacement: Path, attempts: int, load_and_run: Callable[[], Any],
                     expected: Callable[[Any], bool]) -> dict[str, int]:
    """Load and run ``attempts`` times while a thread swaps ``file`` with ``replacement`` and back (``os.replace``)
    as fast as it can; every attempt must end in an hfexport error (the file changed) or in outputs that
    ``expected`` accepts (those of the file the manifest hashes). Returns ``{"ok": n, "refused": n, "swaps": n}``.

    Raises:
        AssertionError: an attempt returned other outputs (a silent change), or failed with another exception.
    """
    import os
    import threading

    from hfexport import IntegrityError

    original = file.with_name(file.name + ".original")
    other = file.with_name(file.name + ".other")
    shutil.copyfile(file, original)
    shutil.copyfile(replacement, other)
    stop, swaps = threading.Event(), [0]

    def swapper() -> None:
        while not stop.is_set():
            for source in (other, original):
                staged = file.with_name(file.name + ".staged")
                shutil.copyfile(source, staged)
                os.replace(staged, file)
                swaps[0] += 1

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    counts = {"ok": 0, "refused": 0}
    try:
        for _ in range(attempts):
            try:
                result = load_and_run()
            except (IntegrityError, ValueError, FileNotFoundError):
                counts["refused"] += 1
                continue
            assert expected(result), "a concurrent writer changed the outputs without an error"
            counts["ok"] += 1
    finally:
        stop.set()
        thread.join()
        shutil.copyfile(original, file)
    return {**counts, "swaps": swaps[0]}


_OPSETS = {"Swish": "opset4", "HSwish": "opset4", "Mish": "opset4", "SoftPlus": "opset4"}  # opset1 otherwise


def add_ir_chains(root: Any, paths: int, per: int, op: str = "Negative", result_inputs: int | None = None) -> None:
    """Route an OpenVINO IR's (``ElementTree`` root, edited in place) output through ``paths`` parallel chains of
    ``per`` ``op`` layers each, joined by Add, Subtract, Add, ... With ``op="Negative"``, an even ``per`` and an odd
    ``paths`` the output is unchanged. ``result_inputs``: the rank of the Result to reroute (the first Result
    otherwise). Shared by tests/openvino's bound tests and benchmarks/probe_bounds.py."""
    from xml.etree import ElementTree

    layers, edges = root.find("layers"), root.find("edges")
    result = next(layer for layer in layers if layer.get("type") == "Result" and (
        result_inputs is None or (layer.find("input/port") is not None
                                  and len(layer.find("input/port")) == result_inputs)))
    port = result.find("input/port")
    edge = next(e for e in edges if e.get("to-layer") == result.get("id"))
    next_id = max(int(layer.get("id")) for layer in layers) + 1
    edges.remove(edge)

    def add(kind: str, inputs: int) -> str:
        nonlocal next_id
        layer = ElementTree.SubElement(layers, "layer", id=str(next_id), name=f"probe_{next_id}", type=kind,
                                       version=_OPSETS.get(kind, "opset1"))
        for tag, ids in (("input", range(inputs)), ("output", [inputs])):
            section = ElementTree.SubElement(layer, tag)
            for pid in ids:
                copy = ElementTree.SubElement(section, "port", id=str(pid), precision=port.get("precision", "FP32"))
                for dim in port.iter("dim"):
                    ElementTree.SubElement(copy, "dim").text = dim.text
        next_id += 1
        return layer.get("id")

    def connect(a: str, a_port: str, b: str, b_port: str) -> None:
        ElementTree.SubElement(edges, "edge", {"from-layer": a, "from-port": a_port, "to-layer": b, "to-port": b_port})

    ends = []
    for _ in range(paths):
        source, source_port = edge.get("from-layer"), edge.get("from-port")
        for _ in range(per):
            layer = add(op, 1)
            connect(source, source_port, layer, "0")
            source, source_port = layer, "1"
        ends.append(source)
    last, last_port = ends[0], "1"
    for i, other in enumerate(ends[1:]):
        join = add("Add" if i % 2 == 0 else "Subtract", 2)
        connect(last, last_port, join, "0")
        connect(other, "1", join, "1")
        last, last_port = join, "2"
    connect(last, last_port, result.get("id"), edge.get("to-port"))
