"""``hfexport.export`` and ``hfexport.load``: find the backend by name and run its exporter or open its runtime."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._artifact import Component, ExportedModel, read_manifest
from ._discovery import get_backend
from ._exporter import ExportConfig
from ._stages import ProgressCallback

__all__ = ["export", "load"]


def export(model: Any, inputs: Mapping[str, Any] | None = None, *, backend: str = "dynamo",
           dynamic: bool = False, config: ExportConfig | None = None, progress: ProgressCallback | None = None,
           **options: Any) -> ExportedModel:
    """Export ``model`` with ``backend`` and return the artifact, runnable on the backend's runtime.

    Args:
        model: a ``torch.nn.Module`` (a Transformers ``PreTrainedModel`` or any module), exported in eval
            mode; its training flags, attributes and patched methods are restored afterwards, also on error.
        inputs: forward keyword arguments (tensors, ``Cache`` objects, pytrees of tensors), e.g.
            ``{"input_ids": LongTensor[batch, seq], "attention_mask": LongTensor[batch, seq]}``. For a
            Transformers model they are built from its config when omitted.
        backend: a name from ``hfexport backends``: ``"dynamo"`` (.pt2), ``"onnx"``, ``"executorch-xnnpack"``,
            ``"executorch-cuda"``, or a third-party one.
        dynamic: make every input dimension dynamic (``Dim.AUTO``); torch.export specializes those it must.
        config: the backend's config object (``OnnxConfig(...)``); ``options`` override its fields.
        progress: called with a ``StageEvent`` at the start and end of every stage.
        **options: fields of the backend's config (``opset_version=18``, ``dynamic_shapes={...}``).

    Returns:
        An :class:`ExportedModel`: call it with the same keyword inputs, ``verify`` it, ``save_pretrained`` it.

    Raises:
        hfexport.UnknownBackendError: the backend is not installed (lists the installed ones, the close matches,
            and the distribution to install when the name belongs to a known family).
        TypeError: an option the backend does not take (lists the ones it does), an option of the wrong type
            (``dynamic="no"``), or a ``config`` of another backend (names both).
        ValueError: ``disable`` names no workaround of the backend (lists close matches).
        hfexport.InvalidInputError: model or inputs of the wrong kind.
        hfexport.ExportError: a stage failed (names backend, stage and model class; cause chained).
    """
    if not isinstance(dynamic, bool):  # "no" is truthy: refuse it rather than turn dynamic shapes on
        raise TypeError(f"dynamic must be True or False, got {dynamic!r} ({type(dynamic).__name__})")
    exporter_class = get_backend(backend).load_exporter()
    if dynamic:
        options["dynamic"] = True
    exporter = exporter_class(config, **options)
    return exporter.export(model, inputs, progress=progress)


def load(path: str | os.PathLike[str]) -> ExportedModel:
    """Load a saved artifact and open every component on its backend's runtime.

    Raises:
        FileNotFoundError: ``path`` has no ``export.json``, or lacks a file the manifest lists.
        ValueError: the manifest's schema is another version, or names a file outside ``path``.
        hfexport.UnknownBackendError: the backend that wrote it is not installed (says what to install).
    """
    path = Path(path)
    manifest = read_manifest(path)
    exporter_class = get_backend(manifest["backend"]).load_exporter()
    if exporter_class.tracer is not None:
        exporter_class.tracer.prepare_load(manifest)
    sections = manifest.get("components") or {"model": manifest}
    components = [Component(name, exporter_class.load_runner(path, manifest, name), manifest=section)
                  for name, section in sections.items()]
    files = [f for f in manifest.get("files", []) if f != "export.json"]
    # Saving a loaded artifact again copies its files (they are the artifact).
    copy = {f: (lambda d, f=f: _copy_file(path / f, d / f)) for f in files}
    return ExportedModel(manifest["backend"], components, manifest, extra_files=copy)


def _copy_file(source: Path, target: Path) -> None:
    import shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
