"""``hfexport.export`` and ``hfexport.load``: find the backend by name and run its exporter or open its runtime."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._artifact import DEFAULT_COMPONENT, Component, ExportedModel, read_manifest
from ._artifact_files import check_integrity, checked_on_read
from ._discovery import get_backend
from ._exporter import ExportConfig
from ._named_types import import_type_modules, load_treespec, treespec_names, unregistered
from ._pipeline import export as export_with
from ._stages import ProgressCallback

__all__ = ["export", "load"]


def export(model: Any, inputs: Mapping[str, Any] | None = None, *, backend: str = "dynamo",
           dynamic: bool = False, config: ExportConfig | None = None, progress: ProgressCallback | None = None,
           task: str | None = None, verify: bool = True, atol: float | None = None, rtol: float | None = None,
           check_resources: bool = True, **options: Any) -> ExportedModel:
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
        task: export the programs a task runs instead of one forward pass: ``"text-generation"`` (one
            ``decoder`` program for prefill and decode, over a KV cache of ``max_cache_len`` positions that the
            runtime updates in place), ``"text2text-generation"`` and
            ``"automatic-speech-recognition"`` (an encoder, a first decoder step and a decode step); the
            artifact then has :meth:`ExportedModel.generate`. ``inputs`` (optional) are the prompt's.
        **options: fields of the backend's config (``opset_version=18``, ``dynamic_shapes={...}``), and with a
            ``task`` the task's options: ``max_cache_len`` (the most tokens a sequence may hold, prompt and new
            ones; default ``max_position_embeddings`` capped at 4,096; encoder-decoders 256), ``max_batch``
            (default 1), ``prefill_chunk`` (the most prompt tokens one call takes, default 256).
        verify: every export is verified: the artifact runs on its runtime and the model in eager PyTorch on
            (copies of) the traced inputs, once each per program, and the report goes into
            ``manifest["verification"]`` (and each program's section, with the inputs and eager outputs that
            ``save_pretrained`` writes to ``verification.safetensors`` for ``hfexport verify DIR``). A mismatch
            raises :class:`hfexport.VerificationError`; ``verify=False`` returns the artifact anyway, its
            manifest recording the report (``passed: false``) or why the verification could not run.
        atol: the absolute tolerance of that verification (default: the backend's ``Exporter.verify_atol``,
            ``1e-4`` for float32 backends).
        rtol: its relative tolerance (default: the backend's ``Exporter.verify_rtol``, ``1e-3``).
        check_resources: refuse, before any trace, an export whose estimated peak (weight bytes times the backend's
            measured ``Exporter.export_peak_ratio``) exceeds this process's RSS plus ``MemAvailable`` (or
            ``HFEXPORT_AVAILABLE_MEMORY=24GB``), or whose artifact the temporary directory's free disk.

    Returns:
        An :class:`ExportedModel`: call it with the same keyword inputs, ``verify`` it, ``save_pretrained`` it.

    Raises:
        hfexport.UnknownBackendError: the backend is not installed (lists the installed ones, the close matches,
            and the distribution to install when the name belongs to a known family).
        TypeError: an option the backend does not take (lists the ones it does), an option of the wrong type
            (``dynamic="no"``), or a ``config`` of another backend (names both).
        ValueError: ``disable`` names no workaround of the backend (lists close matches).
        hfexport.InvalidInputError: model or inputs of the wrong kind.
        hfexport.InsufficientResourcesError: (a ``MemoryError``) it would not fit: names the figures and what would.
        hfexport.ExportError: a stage failed (names backend, stage and model class; cause chained), or the
            artifact or the eager model could not run on the traced inputs for the verification.
        hfexport.VerificationError: (an ``ExportError``) the artifact's outputs differ from eager PyTorch beyond
            the tolerances; lists each failing output with its max abs diff and tolerance.
    """
    if not isinstance(dynamic, bool):  # "no" is truthy: refuse it rather than turn dynamic shapes on
        raise TypeError(f"dynamic must be True or False, got {dynamic!r} ({type(dynamic).__name__})")
    exporter_class = get_backend(backend).load_exporter()
    if dynamic:
        options["dynamic"] = True
    task_options = None
    if task is not None:  # the task's options are a dataclass of the tracer's: its fields, by name
        if exporter_class.tracer is None or not hasattr(exporter_class.tracer, "task_options"):
            raise ValueError(f"backend {backend!r} exports single programs only (its tracer plans no tasks); "
                             f"export without task={task!r}")
        options_class = exporter_class.tracer.task_options(task)
        names = [f.name for f in dataclasses.fields(options_class)]
        config_names = exporter_class.config_class.option_names()
        unknown = [name for name in options if name not in names and name not in config_names]
        if unknown:
            raise TypeError(f"{', '.join(map(repr, unknown))}: not an option of backend {backend!r} "
                            f"({exporter_class.config_class.__name__}: {', '.join(config_names)}) nor of task "
                            f"{task!r} ({options_class.__name__}: {', '.join(names)})")
        task_options = options_class(**{name: options.pop(name) for name in list(options) if name in names})
    return export_with(exporter_class(config, **options), model, inputs, progress=progress, task=task,
                           task_options=task_options, verify=verify, atol=atol, rtol=rtol,
                           check_resources=check_resources)


def load(path: str | os.PathLike[str], *, revision: str | None = None, subfolder: str | None = None,
         trust_remote_code: bool = False, cache_dir: str | os.PathLike[str] | None = None,
         token: str | bool | None = None) -> ExportedModel:
    """Load a saved artifact (a directory, or a Hub repository ``"org/name"``) and open every component on its
    backend's runtime.

    An artifact is untrusted input: before any runtime opens a file, the manifest is validated (schema, every
    file it names inside ``path``) and every file's size and SHA-256 are checked against it. No code runs from
    it: the output types must be registered pytree nodes (Transformers' are registered for you; hfexport
    imports no module an artifact names) and a program whose loading would unpickle objects other than
    tensors, or load native code, is refused.

    A Hub repository id (a string that is not an existing local path and looks like ``org/name``) is fetched
    through ``huggingface_hub``: ``export.json`` first, checked as above, then only the files it names, from the
    same commit, into the Hugging Face cache; the snapshot directory is then loaded like any other. With
    ``HF_HUB_OFFLINE=1`` it is read from the cache.

    Args:
        path: the artifact directory, or a Hub repository id.
        revision: for a repository id: a branch, tag or commit (default ``main``).
        subfolder: the artifact's folder inside the repository or directory (``push_to_hub`` uses
            ``"hfexport/<backend>"`` by default).
        cache_dir: for a repository id: the Hugging Face cache (default ``HF_HUB_CACHE``).
        token: for a repository id: a Hub token (default: the one ``hf auth login`` saved).
        trust_remote_code: allow what the default refuses (unpickling arbitrary objects from a ``.pt2``,
            importing the modules the output spec names). Only for an artifact from a source you trust.

    Raises:
        FileNotFoundError: ``path`` has no ``export.json``, or lacks a file the manifest names; a repository or
            revision that does not exist; offline, an artifact the cache does not hold (says which files).
        hfexport.ManifestError: the manifest is not JSON, not an object, lacks keys or has values of the wrong
            type, or is of another schema version (one line per problem).
        ValueError: the manifest names a file outside ``path`` (absolute, ``..``, a symlink that leads out).
        hfexport.IntegrityError: a file's size or SHA-256 differs from the manifest's (names the file).
        hfexport.UntrustedArtifactError: loading would run code from the artifact (says what, and how to
            opt in).
        hfexport.UnknownBackendError: the backend that wrote it is not installed (says what to install).
    """
    from ._hub import is_hub_reference

    if is_hub_reference(path):
        from ._hub import download_artifact

        path = download_artifact(str(path), revision=revision, subfolder=subfolder, cache_dir=cache_dir, token=token)
    elif revision is not None:
        raise ValueError(f"revision={revision!r} is for a Hub repository id; {str(path)!r} is a local path")
    else:
        path = Path(path) / subfolder if subfolder else Path(path)
    manifest = read_manifest(path)
    # the files the backend's runners read through artifact_bytes are hashed there, on the bytes they hand over
    deferred = _checked_on_read_names(manifest)
    check_integrity(path, manifest, trust_remote_code=trust_remote_code, defer=deferred)
    with checked_on_read(path, manifest, deferred):
        return open_artifact(path, manifest, trust_remote_code=trust_remote_code)


def _checked_on_read_names(manifest: Mapping[str, Any]) -> set[str]:
    """The file names at the backend's ``Exporter.checked_on_read`` keys of every component section (none for a
    backend that is not installed: open_artifact then says so)."""
    try:
        keys = get_backend(manifest["backend"]).load_exporter().checked_on_read
    except Exception:  # noqa: BLE001 - an unknown backend is open_artifact's error to raise
        return set()
    names = set()
    for section in (manifest.get("components") or {DEFAULT_COMPONENT: manifest}).values():
        for key in keys:
            value: Any = section
            for part in key.split("."):
                value = value.get(part) if isinstance(value, Mapping) else None
            if isinstance(value, str):
                names.add(value)
    return names


def open_artifact(path: Path, manifest: dict[str, Any], *, trust_remote_code: bool = False) -> ExportedModel:
    """Open every component of an artifact whose manifest :func:`read_manifest` read and
    :func:`~hfexport._artifact_files.check_integrity` checked (what :func:`load` does after those two)."""
    exporter_class = get_backend(manifest["backend"]).load_exporter()
    if exporter_class.tracer is not None:
        exporter_class.tracer.prepare_load(manifest, trust_remote_code=trust_remote_code)
    sections = manifest.get("components") or {DEFAULT_COMPONENT: manifest}
    components = []
    for name, section in sections.items():
        runner = exporter_class.load_runner(path, manifest, name, trust_remote_code=trust_remote_code)
        components.append(Component(name, runner, _out_spec(name, section, trust_remote_code), manifest=section))
    files = [f for f in manifest.get("files", []) if f != "export.json"]
    # Saving a loaded artifact again copies its files (they are the artifact).
    copy = {f: (lambda d, f=f: _copy_file(path / f, d / f)) for f in files}
    generator = getattr(exporter_class.tracer, "generate", None) if manifest.get("task") else None
    # the tracer may name a subclass for a task's artifact (a text-generation one that transformers' pipeline takes)
    artifact_class = getattr(exporter_class.tracer, "artifact_class", None)
    cls = artifact_class(manifest) if artifact_class is not None else ExportedModel
    if not (isinstance(cls, type) and issubclass(cls, ExportedModel)):
        raise TypeError(f"the {manifest['backend']} backend's tracer named {cls!r} as the artifact's class; it must be "
                        "an hfexport.ExportedModel subclass")
    exported = cls(manifest["backend"], components, manifest, extra_files=copy, generator=generator)
    exported.directory = path  # verify_stored() reads its verification.safetensors
    return exported


def _out_spec(name: str, section: Mapping[str, Any], trust_remote_code: bool) -> Any:
    """The component's output ``TreeSpec`` from its manifest section (``None`` without an ``output_spec``).

    Read by :func:`hfexport._named_types.load_treespec` (allow-listed types, nothing imported); with
    ``trust_remote_code`` by torch's ``treespec_loads``, after importing the modules its type names give."""
    spec = section.get("output_spec")
    if spec is None:
        return None
    import torch.utils._pytree as pytree

    where = f"the output_spec of component {name!r}"
    if trust_remote_code:  # the caller trusts the artifact: torch's reader, which imports what the spec names
        types, _ = treespec_names(spec)
        import_type_modules(unregistered(types))
        return pytree.treespec_loads(spec)
    return load_treespec(spec, where)


def _copy_file(source: Path, target: Path) -> None:
    import shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
