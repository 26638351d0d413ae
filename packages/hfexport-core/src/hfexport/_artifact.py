"""The artifact every backend shares: named components (programs with their runners), the manifest, atomic
save, reading a saved manifest, and verification against eager PyTorch.

Nothing here knows a backend: opening a saved artifact on its runtime is ``hfexport.load`` (``_api``), which
finds the backend through discovery.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ._artifact_files import (  # read_manifest: re-exported here, an artifact's name
    file_digests,
    read_manifest,
)
from ._comparison import (  # re-exported: the artifact's names
    COMPARISONS,
    DEFAULT_COMPONENT,
    OutputDiff,
    VerificationError,
    VerificationReport,
    _shapes,
    compare_outputs,
    flatten_with_names,
)
from ._input_check import check_call_inputs
from ._named_types import load_treespec
from ._runners import FileRunner, Runner  # re-exported: the artifact's names
from ._saving import (
    check_free_space,
    check_target,
    disk_full_error,
    is_disk_full,
    make_staging,
    recover_retired,
    replace_directory,
    save_lock,
    tree_size,
)
from ._trust import (  # MANIFEST_NAME, SCHEMA_VERSION: re-exported here, the artifact's names
    HASHES_KEY,
    MANIFEST_NAME,
    SCHEMA_VERSION,
)

__all__ = ["Component", "component_manifest", "DEFAULT_COMPONENT", "ExportedModel", "FileRunner", "MANIFEST_NAME", "OutputDiff",
           "Runner", "SCHEMA_VERSION", "VerificationError", "VerificationReport", "compare_outputs",
           "flatten_with_names", "read_manifest", "versions_of"]



def same_constant(value: Any, baked: Any) -> bool:
    """Whether a call's ``value`` is the constant baked into an export (``manifest["fixed_kwargs"]``): Python
    values compare with ``==``; a tensor (an integer input such as ``image_grid_thw`` that the exporter bakes in)
    compares by its values, which the manifest holds as nested lists."""
    if hasattr(value, "tolist") and not isinstance(value, bool | int | float | str):
        value = value.tolist()
    return bool(value == baked)


@dataclass
class Component:
    """One program of an artifact, with the runner that runs it.

    An artifact has one (``"model"``; a decoder's ``"decoder"`` for text-generation) or several (an encoder-decoder's
    encoder, prefill and decode programs).

    Attributes:
        name: the component name (``"model"``, ``"decoder"``, ``"encoder"``, ``"prefill"``, ``"decode"``).
        runner: runs the program: ``run(args) -> flat outputs``.
        out_spec: the pytree ``TreeSpec`` that rebuilds the outputs (``None``: read from the manifest).
        write: writes the component's file(s) into a directory; returns their names.
        manifest: the component's manifest section (``program_file``, ``inputs``, ``outputs``,
            ``output_spec``, backend-specific keys).
        program: the ``ExportedProgram`` it was lowered from, for the manifest (not saved).
        verification: the inputs and eager outputs of the export's verification as flat tensors
            (``inputs.<name>.<leaf>``, ``outputs.<name>``), written to ``verification.safetensors`` on save
            (``None`` for a loaded component: the file is copied like the others).
        at_root: the backend's deployment engine loads the artifact's root (OpenVINO GenAI's
            ``LLMPipeline(dir)`` reads ``openvino_model.xml`` there, ORT GenAI's ``Model(dir)`` ``genai_config.json``):
            as a task's only component, its files go at the root rather than into a folder of its name.
    """

    name: str
    runner: Runner
    out_spec: Any = None
    write: Callable[[Path], Any] | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    program: Any = field(default=None, repr=False)
    verification: dict[str, Any] | None = field(default=None, repr=False)
    at_root: bool = False


def versions_of(distributions: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Installed versions of ``distributions`` (``"not installed"`` when absent)."""
    out = {}
    for dist in distributions:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def component_manifest(manifest: Mapping[str, Any], component: str = DEFAULT_COMPONENT) -> dict[str, Any]:
    """The manifest section of ``component`` (``manifest["components"][component]``); the whole manifest for a
    schema-1 artifact, whose one component's keys stand at the top level."""
    return manifest.get("components", {}).get(component, manifest)


# what transformers' pipelines read of their model first (an artifact that is not a transformers model says so)
_MODEL_ATTRIBUTES = frozenset({"device", "config", "generation_config", "can_generate", "dtype"})


class ExportedModel:
    """An exported model: one or several named programs, runnable on the backend's runtime.

    Attributes:
        backend: the backend name.
        components: name -> :class:`Component`; calling the model runs ``"model"`` (or the only one).
        manifest: the ``export.json`` content (inputs, outputs, versions, workarounds, components ...).
        extra_files: file name -> writer of the files saved besides the programs (``config.json``).
        reference: the eager callable to verify against (the model with the export's fixed keyword
            arguments); ``None`` after :func:`hfexport.load` unless passed to :meth:`verify`.
        generator: runs :meth:`generate` over the components (the tracer's ``generate``; set for an artifact
            exported with a generative ``task``).
        directory: the directory :func:`hfexport.load` read it from (``None`` for an export in memory).
    """

    def __init__(self, backend: str, components: Sequence[Component] | Mapping[str, Component],
                 manifest: dict[str, Any], *, extra_files: Mapping[str, Callable[[Path], Any]] | None = None,
                 reference: Callable[..., Any] | None = None, generator: Callable[..., Any] | None = None):
        self.backend = backend
        items = list(components.values()) if isinstance(components, Mapping) else list(components)
        if not items:
            raise ValueError("an ExportedModel needs at least one component")
        self.components = {c.name: c for c in items}
        self.manifest = manifest
        self.extra_files = dict(extra_files or {})
        self.reference = reference
        self.generator = generator
        self.directory: Path | None = None  # where a loaded artifact was read from (its stored verification)

    def __getattr__(self, name: str) -> Any:
        """A missing attribute; those a transformers pipeline reads of its model say which artifact it takes."""
        if name in _MODEL_ATTRIBUTES:
            task = self.__dict__.get("manifest", {}).get("task")
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}: this {self.__dict__.get('backend')} "
                f"artifact ({f'task {task!r}' if task else 'one forward pass'}) is not a transformers model. "
                "pipeline('text-generation', model=...) takes hfexport.load(dir) of a task='text-generation' artifact "
                "as it is, or hfexport_dynamo.tasks.as_transformers(artifact, config=model.config) for one not saved")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        inputs = ", ".join(i["name"] for i in self.manifest.get("inputs", []))
        return (f"ExportedModel(backend={self.backend!r}, model={self.manifest.get('model_class')!r}, "
                f"components={list(self.components)}, inputs=[{inputs}])")

    @property
    def default_component(self) -> Component:
        return self.components.get(DEFAULT_COMPONENT) or next(iter(self.components.values()))

    @property
    def runner(self) -> Runner:
        """The default component's runner."""
        return self.default_component.runner

    def _section(self, component: Component) -> dict[str, Any]:
        return self.manifest.get("components", {}).get(component.name) or component.manifest or self.manifest

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self._section(self.default_component)["inputs"]]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self._section(self.default_component)["outputs"]]

    def out_spec(self, component: Component | None = None) -> Any:
        """The outputs' ``TreeSpec`` of ``component`` (default: the default one)."""
        component = component or self.default_component
        if component.out_spec is None:
            section = self._section(component)
            # hfexport's own reader: allow-listed types, no import by a name the artifact gives
            component.out_spec = load_treespec(section["output_spec"],
                                               f"the output_spec of component {component.name!r}")
        return component.out_spec

    def __call__(self, **inputs: Any) -> Any:
        """Run the default component on the backend's runtime; returns the model's output structure.

        Raises:
            TypeError: an input is missing or unknown (the message lists the expected names).
            ValueError: a keyword baked into the export is passed with another value.
        """
        return self.run(self.default_component.name, **inputs)

    def run(self, component: str, /, **inputs: Any) -> Any:
        """Run the named component with keyword ``inputs``; returns its output structure.

        Inputs are checked against the manifest before the runtime is called: dtype (a floating input is cast
        to the program's floating dtype), rank, static sizes, dynamic ranges, and dims that share a symbol.
        Inputs the export dropped because the model ignores them (``ignored_inputs``: ``head_mask``) are dropped.

        Raises:
            KeyError: no such component (the message lists them).
            TypeError: an input is missing or unknown, not a tensor, or of another dtype (names what it takes).
            ValueError: an input's shape is outside what the program takes (names the dim and the range).
        """
        if component not in self.components:
            raise KeyError(f"no component {component!r}; this artifact has {list(self.components)}")
        part = self.components[component]
        section = self._section(part)
        names = [i["name"] for i in section["inputs"]]
        fixed = section.get("fixed_kwargs", self.manifest.get("fixed_kwargs", {}))
        ignored = {n for n in section.get("ignored_inputs", self.manifest.get("ignored_inputs", []))
                   if isinstance(n, str)}
        inputs = {k: v for k, v in inputs.items() if k not in ignored or k in names}  # the model ignores them
        for name in [n for n in inputs if n in fixed and n not in names]:
            if not same_constant(inputs[name], fixed[name]):
                raise ValueError(f"{name}={inputs[name]!r} was baked into this export as {fixed[name]!r}; "
                                 f"re-export with {name}={inputs[name]!r} to change it")
            inputs = {k: v for k, v in inputs.items() if k != name}
        missing = [n for n in names if n not in inputs]
        unknown = [n for n in inputs if n not in names]
        if missing or unknown:
            raise TypeError(f"this {self.backend} export takes inputs {names}; missing {missing}, unknown {unknown}")
        inputs = check_call_inputs(section["inputs"], inputs, f"this {self.backend} export"
                                   + (f" ({component})" if len(self.components) > 1 else ""))
        import torch.utils._pytree as pytree

        flat = part.runner.run(tuple(inputs[n] for n in names))
        return pytree.tree_unflatten(list(flat), self.out_spec(part))

    def verify(self, inputs: Mapping[str, Any], *, atol: float = 1e-5, rtol: float = 1e-5,
               reference: Callable[..., Any] | None = None) -> VerificationReport:
        """Run ``inputs`` on the runtime and on eager PyTorch; report the max abs diff of every output.

        Args:
            inputs: forward keyword arguments (may differ in shape from the traced ones along dynamic dims).
            atol: absolute tolerance.
            rtol: relative tolerance.
            reference: the eager model; defaults to the one exported in this process. The export's fixed
                keyword arguments (``manifest["fixed_kwargs"]``, e.g. ``use_cache=False``) are added.

        The report (per output: max abs and rel diff, tolerance; the input shapes) is stored in
        ``manifest["verification"]``, so that a save after verifying keeps it in ``export.json``.

        Raises:
            ValueError: no eager reference is available (after :func:`load`, pass ``reference=model``).
        """

        if reference is not None:
            fixed = self.manifest.get("fixed_kwargs", {})
            model = reference
            reference = lambda **kw: model(**{**fixed, **kw})  # noqa: E731
        reference = reference or self.reference
        if reference is None:
            raise ValueError("no eager model to compare against: pass verify(inputs, reference=model)")
        return self._compare(inputs, atol, rtol, reference)[0]

    def _compare(self, inputs: Mapping[str, Any], atol: float, rtol: float,
                 reference: Callable[..., Any]) -> tuple[VerificationReport, Any]:
        """One eager call and one runtime call on deep copies of ``inputs``; the report (also stored in
        ``manifest["verification"]``) and the eager outputs."""
        import torch

        with torch.no_grad():
            expected = reference(**copy.deepcopy(dict(inputs)))
            actual = self(**copy.deepcopy(dict(inputs)))
        report = self._comparison(expected, actual, atol, rtol, self._section(self.default_component))
        report.inputs = _shapes(inputs)
        self.manifest["verification"] = report.as_dict()
        return report, expected

    def _comparison(self, expected: Any, actual: Any, atol: float, rtol: float,
                    section: Mapping[str, Any]) -> VerificationReport:
        """:func:`compare_outputs`, or the comparison of :data:`COMPARISONS` whose key the component's manifest
        ``section`` (or the manifest) holds: a quantized artifact is compared with float eager by cosine similarity."""
        for key, compare in COMPARISONS.items():
            spec = section.get(key) or self.manifest.get(key)
            if isinstance(spec, Mapping):
                return compare(self.backend, expected, actual, spec, atol=atol, rtol=rtol)
        return compare_outputs(self.backend, expected, actual, atol, rtol)

    def verify_export(self, inputs: Mapping[str, Any], *, atol: float, rtol: float) -> VerificationReport:
        """The verification an export runs (``Exporter.export`` calls it): :meth:`verify` of the default
        component on ``inputs`` against :attr:`reference`, whose report is also kept in the component's manifest
        section (``components.<name>.verification``) with the inputs and eager outputs, which a save writes to
        ``verification.safetensors`` for :meth:`verify_stored` (when they can be stored: tensors only).

        Raises:
            ValueError: no eager reference (an artifact built without one).
        """
        if self.reference is None:
            raise ValueError("no eager model to compare against: this artifact was built without a reference")
        from ._stored import verification_tensors

        component = self.default_component
        report, expected = self._compare(inputs, atol, rtol, self.reference)
        names, leaves, _ = flatten_with_names(expected)
        kept = verification_tensors(inputs, [i["name"] for i in self._section(component)["inputs"]],
                                    list(zip(names, leaves, strict=True)))
        section = dict(report.as_dict())
        if isinstance(kept, str):
            section["stored"] = None
            section["not_stored"] = kept
        else:
            component.verification, section["stored"] = kept
        self._section(component)["verification"] = section
        return report

    def verify_stored(self) -> dict[str, VerificationReport]:
        """Re-run the inputs stored with the artifact (its export's verification) on the runtime and compare the
        outputs with the stored eager ones, with the stored tolerances. Needs no model.

        Returns:
            Component name -> :class:`VerificationReport` (``passed`` False on a mismatch; NaN/Inf as such), for
            every component that stores inputs.

        Raises:
            ValueError: the artifact stores no verification inputs (exported before they were stored, or with
                inputs that are not tensors); or the stored file disagrees with the manifest (names, leaf counts,
                output names or dtypes).
            TypeError: a stored input does not fit the program (dtype, shape: as for any call).
        """
        import torch

        from ._stored import built_inputs_budget, read_stored, stored_inputs_and_outputs

        reports = {}
        for component in self.components.values():
            section = self._section(component)
            verification = section.get("verification")
            stored = verification.get("stored") if isinstance(verification, dict) else None
            if not isinstance(stored, dict):
                continue
            where = f"component {component.name!r}"
            tensors = component.verification
            if tensors is None:
                name = stored.get("data_file")
                if self.directory is None or not isinstance(name, str) or name not in self.manifest.get("files", []):
                    raise ValueError(f"{where}: its stored verification file {name!r} is not a file of this "
                                     "artifact's manifest")
                from ._artifact_files import artifact_bytes

                # read once by descriptor and checked against the manifest's hash: what is compared is what was hashed
                tensors = read_stored(self.directory / name, artifact_bytes(self.directory, self.manifest, name,
                                                                            f"{where}'s verification.stored.data_file"))
            atol, rtol = verification.get("atol"), verification.get("rtol")
            if not all(isinstance(t, int | float) and not isinstance(t, bool) and t >= 0 for t in (atol, rtol)):
                raise ValueError(f"{where}: the stored verification has no valid atol and rtol ({atol!r}, {rtol!r})")
            inputs, expected = stored_inputs_and_outputs(stored, tensors, section, where,
                                                         max_zero_bytes=built_inputs_budget(self.manifest))
            with torch.no_grad():
                actual = self.run(component.name, **copy.deepcopy(inputs))
            reset = getattr(component.runner, "reset", None)
            if callable(reset):
                reset()  # the stored run leaves the artifact's state where it was
            names, leaves, _ = flatten_with_names(actual)
            by_name = dict(zip(names, leaves, strict=True))
            missing = [n for n in expected if n not in by_name]
            if missing:
                raise ValueError(f"{where}: the runtime returned no outputs named {missing} (it returned {names})")
            report = self._comparison(expected, {n: by_name[n] for n in expected}, float(atol), float(rtol), section)
            report.inputs = _shapes(inputs)
            reports[component.name] = report
        if not reports:
            raise ValueError(f"this {self.backend} artifact stores no verification inputs (exported before "
                             "hfexport stored them, or its inputs are not plain tensors): compare it with eager "
                             "PyTorch instead, e.g. verify(inputs, reference=model) or `hfexport verify DIR --model "
                             "MODEL_DIR`")
        return reports

    def generate(self, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any:
        """Greedy decoding over the exported programs, on the backend's runtime (token ids in, token ids out).

        Needs an artifact exported with a generative task (``hfexport.export(model, task="text-generation")``;
        ``"text2text-generation"``, ``"automatic-speech-recognition"``). The loop is the tracer's
        (``hfexport_dynamo.tasks.decoding.generate``, which documents the options: ``max_new_tokens``,
        ``eos_token_id``, ``pad_token_id``, ...).

        Args:
            input_ids: ``LongTensor[batch, prompt]``, left-padded for prompts of different lengths (the encoder
                input of an encoder-decoder; ``input_features`` ``FloatTensor[batch, mels, frames]`` for speech).
            attention_mask: ``LongTensor[batch, prompt]``, 0 at padding (default: all ones).

        Returns:
            ``LongTensor[batch, prompt + new]`` for a decoder (``[batch, 1 + new]`` decoder ids for an
            encoder-decoder), as transformers' ``generate`` returns them.

        Raises:
            ValueError: the artifact was exported for one forward pass (says which task to export with).
        """
        task = self.manifest.get("task")
        if self.generator is None:
            raise ValueError(f"this {self.backend} artifact of {self.manifest.get('model_class')} was exported for "
                             f"{f'task {task!r}' if task else 'one forward pass'} and cannot generate: export it "
                             "with task='text-generation' (decoders), 'text2text-generation' (encoder-decoders), "
                             "'automatic-speech-recognition' (Whisper), 'image-text-to-text' (vision-language "
                             "models) or 'audio-text-to-text' (audio-language models), or `hfexport export MODEL "
                             "--task ...`")
        return self.generator(self, input_ids, attention_mask, **options)

    # ── saving ────────────────────────────────────────────────────────────────────────────────────────
    def save_pretrained(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the program file(s), ``export.json`` and the model config into directory ``path``.

        Atomic: everything is written into a temporary directory beside ``path`` and moved into place in one
        step; a failure leaves no artifact, and an earlier artifact at ``path`` as it was. Saves to one path
        are serialized (a lock file ``.<name>.lock`` beside it, removed afterwards), so of two concurrent
        saves without ``overwrite`` one succeeds and the other raises ``FileExistsError``.

        Args:
            path: the artifact directory.
            overwrite: replace an earlier hfexport artifact (a directory holding ``export.json``) at ``path``.
                A directory that is not an artifact is never replaced.

        Raises:
            FileExistsError: ``path`` is a file; or a non-empty directory and ``overwrite`` is False; or a
                non-empty directory that is not an hfexport artifact.
            OSError: the disk filled (``errno.ENOSPC``; names the path and the bytes needed, where known).
            TimeoutError: another save to ``path`` did not finish within ``hfexport._saving.LOCK_TIMEOUT_S``.
        """
        target = Path(path).absolute()
        if target.exists() and not target.is_dir():
            raise FileExistsError(f"{target} exists and is not a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        with save_lock(target):
            recover_retired(target, MANIFEST_NAME)
            check_target(target, overwrite, MANIFEST_NAME)
            needed = self._size_hint()
            check_free_space(target, needed)
            staging = make_staging(target)
            try:
                manifest = self._write_into(staging)
                replace_directory(staging, target)
            except BaseException as exc:
                written = tree_size(staging)
                shutil.rmtree(staging, ignore_errors=True)
                if is_disk_full(exc):
                    raise disk_full_error(target, needed, written) from exc
                raise
        self.manifest = manifest
        return target

    def _write_into(self, staging: Path) -> dict[str, Any]:
        """Write every component's files, the extra files and the manifest into ``staging``; the manifest."""
        files: list[str] = []
        for component in self.components.values():
            written = component.write(staging) if component.write else None
            files.extend(written if isinstance(written, list | tuple) else [])
            stored = (self._section(component).get("verification") or {}).get("stored")
            if component.verification is not None and isinstance(stored, dict):
                from ._stored import write_stored

                write_stored(component.verification, staging / stored["data_file"])
                files.append(stored["data_file"])
        for name, write in self.extra_files.items():
            written = write(staging)
            files.extend(written if isinstance(written, list | tuple) else [name])
        names = sorted(set(files) | {MANIFEST_NAME})
        hashes = file_digests(staging, [f for f in names if f != MANIFEST_NAME])  # checked on load
        manifest = dict(self.manifest, schema_version=SCHEMA_VERSION, files=names, **{HASHES_KEY: hashes})
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        return manifest

    def _size_hint(self) -> int | None:
        """A lower bound of the bytes a save writes, where it is known: the files of file-backed runners,
        the weights of in-memory programs, the ``nbytes`` of extra-file writers that give one."""
        total = 0
        for component in self.components.values():
            try:
                files = getattr(component.runner, "files", None)
                program = component.program if component.program is not None else \
                    getattr(component.runner, "program", None)
                if files:
                    total += sum(Path(f).stat().st_size for f in files)
                elif program is not None:
                    total += _tensor_bytes(program)
            except Exception:  # a hint only
                continue
        total += sum(int(getattr(w, "nbytes", 0) or 0) for w in self.extra_files.values())
        return total or None

    save = save_pretrained

    def push_to_hub(self, repo_id: str, *, revision: str | None = None, path_in_repo: str | None = None,
                    commit_message: str | None = None, token: str | bool | None = None, create_repo: bool = True,
                    private: bool | None = None, endpoint: str | None = None, api: Any = None) -> Any:
        """Upload the artifact to Hub repository ``repo_id`` in one commit, beside the files already there.

        The artifact is saved into a temporary directory (as :meth:`save_pretrained` writes it, hashes
        included) and each of its files is added under ``path_in_repo``. Nothing in the repository is deleted;
        a file of the same name that differs is refused unless an earlier hfexport artifact at that path wrote
        it (its ``export.json`` names it). Load it back with
        ``hfexport.load(repo_id, subfolder=path_in_repo)``.

        Args:
            repo_id: ``"org/name"``; created (``exist_ok``) when ``create_repo``.
            revision: the branch to commit to (default ``main``; created when ``create_repo``).
            path_in_repo: the folder to upload into. Default ``"hfexport/<backend>"``, a folder of its own, so
                that it never meets the model's own ``config.json`` or weights; ``""`` uploads to the root.
            commit_message: default ``"hfexport: <backend> artifact of <model class> ..."``.
            token: a Hub token (default: the one ``hf auth login`` saved).
            create_repo: create the repository (and ``revision``'s branch) if it does not exist.
            private: visibility of a repository this call creates.
            endpoint: another Hub endpoint (default ``HF_ENDPOINT`` or huggingface.co).
            api: an ``huggingface_hub.HfApi`` to use instead of a new one.

        Returns:
            The ``huggingface_hub.CommitInfo`` of the commit.

        Raises:
            FileExistsError: a file of the artifact would replace a different file that is not an hfexport
                artifact's (names them; nothing is uploaded).
            ValueError: ``path_in_repo`` is not a relative folder.
            huggingface_hub.errors.HfHubHTTPError: the Hub refused (authentication, permissions).
        """
        from ._hub import push_artifact

        return push_artifact(self, repo_id, revision=revision, path_in_repo=path_in_repo,
                             commit_message=commit_message, token=token, create_repo=create_repo, private=private,
                             endpoint=endpoint, api=api)


def _tensor_bytes(program: Any) -> int:
    """Bytes of the distinct tensor storages of a program's ``state_dict`` and ``constants``."""
    seen, total = set(), 0
    for mapping in (getattr(program, "state_dict", None) or {}, getattr(program, "constants", None) or {}):
        for value in mapping.values():
            storage = getattr(value, "untyped_storage", None)
            if storage is None:
                continue
            storage = storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total
