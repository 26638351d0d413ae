"""The artifact: an exported program with its runner, manifest, atomic save, load and verification."""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

__all__ = ["ExportedModel", "OutputDiff", "Runner", "VerificationReport", "load", "MANIFEST_NAME",
           "SCHEMA_VERSION"]

MANIFEST_NAME = "export.json"
SCHEMA_VERSION = 1


class Runner(Protocol):
    """Runs an exported program on its runtime.

    ``run(args)`` takes the top-level inputs in signature order (tensors or pytrees of tensors) and
    returns the flat list of output tensors, in the order of the program's output spec.
    """

    def run(self, args: tuple[Any, ...]) -> list[Any]: ...


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts) or "output"


def flatten_with_names(tree: Any) -> tuple[list[str], list[Any], Any]:
    """``(names, leaves, treespec)`` of a pytree; names are dotted key paths (``"last_hidden_state"``)."""
    import torch.utils._pytree as pytree

    pairs, spec = pytree.tree_flatten_with_path(tree)
    return [_path_name(p) for p, _ in pairs], [leaf for _, leaf in pairs], spec


def versions_of(distributions: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Installed versions of ``distributions`` (``"not installed"`` when absent)."""
    out = {}
    for dist in distributions:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


@dataclass
class OutputDiff:
    """Comparison of one output tensor against eager PyTorch."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_diff: float
    ok: bool


@dataclass
class VerificationReport:
    """Max abs difference of every output against eager, with the tolerances used.

    ``passed`` is True when every output satisfies ``|exported - eager| <= atol + rtol * |eager|``
    (integer and boolean outputs must be equal).
    """

    backend: str
    atol: float
    rtol: float
    outputs: list[OutputDiff] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.ok for o in self.outputs)

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=float("nan"))

    def __getitem__(self, name: str) -> OutputDiff:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"no output {name!r}; outputs: {[o.name for o in self.outputs]}")

    def __str__(self) -> str:
        lines = [f"verification on {self.backend} (atol={self.atol:g}, rtol={self.rtol:g}): "
                 f"{'PASSED' if self.passed else 'FAILED'}"]
        for o in self.outputs:
            lines.append(f"  {'✅' if o.ok else '❌'} {o.name:<28} {str(list(o.shape)):<18} {o.dtype:<10} "
                         f"max abs diff {o.max_abs_diff:.3e}")
        return "\n".join(lines)


def compare_outputs(backend: str, expected: Any, actual: Any, atol: float, rtol: float) -> VerificationReport:
    """Compare two output pytrees leaf by leaf.

    Raises:
        ValueError: the structures differ (names the leaves on each side).
    """
    import torch

    names, exp_leaves, exp_spec = flatten_with_names(expected)
    act_names, act_leaves, act_spec = flatten_with_names(actual)
    if len(exp_leaves) != len(act_leaves):
        raise ValueError(f"exported outputs {act_names} do not match eager outputs {names}")
    report = VerificationReport(backend, atol, rtol)
    for name, e, a in zip(names, exp_leaves, act_leaves, strict=True):
        if not isinstance(e, torch.Tensor):
            report.outputs.append(OutputDiff(name, (), type(e).__name__, 0.0 if e == a else float("inf"), e == a))
            continue
        a = torch.as_tensor(a).to(e.device)
        if a.shape != e.shape:
            report.outputs.append(OutputDiff(name, tuple(a.shape), str(e.dtype).replace("torch.", ""),
                                             float("inf"), False))
            continue
        if e.is_floating_point() or e.is_complex():
            diff = (a.double() - e.double()).abs()
            ok = bool(torch.all(diff <= atol + rtol * e.double().abs())) and not bool(torch.isnan(a).any() ^ torch.isnan(e).any())
            diff = diff.nan_to_num(0.0)
        else:
            diff = (a.long() - e.long()).abs()
            ok = bool(torch.equal(a.to(e.dtype), e))
        report.outputs.append(OutputDiff(name, tuple(e.shape), str(e.dtype).replace("torch.", ""),
                                         float(diff.max()) if diff.numel() else 0.0, ok))
    return report


class ExportedModel:
    """An exported program, runnable on its backend's runtime.

    Attributes:
        backend: the backend name.
        manifest: the ``export.json`` content (inputs, outputs, versions, workarounds ...).
        reference: the eager callable to verify against (the model with the export's fixed keyword
            arguments); ``None`` after :func:`load` unless passed to :meth:`verify`.
    """

    def __init__(self, backend: str, runner: Runner, manifest: dict[str, Any], *,
                 components: Mapping[str, Callable[[Path], Any]] | None = None,
                 out_spec: Any = None, reference: Callable[..., Any] | None = None):
        self.backend = backend
        self.runner = runner
        self.manifest = manifest
        self.components = dict(components or {})
        self.reference = reference
        self._out_spec = out_spec

    def __repr__(self) -> str:
        inputs = ", ".join(i["name"] for i in self.manifest.get("inputs", []))
        return f"ExportedModel(backend={self.backend!r}, model={self.manifest.get('model_class')!r}, inputs=[{inputs}])"

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.manifest["inputs"]]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.manifest["outputs"]]

    @property
    def out_spec(self) -> Any:
        if self._out_spec is None:
            import torch.utils._pytree as pytree

            for module in self.manifest.get("output_modules", []):
                importlib.import_module(module)
            self._out_spec = pytree.treespec_loads(self.manifest["output_spec"])
        return self._out_spec

    def __call__(self, **inputs: Any) -> Any:
        """Run on the backend's runtime; returns the model's output structure (e.g. a ``ModelOutput``).

        Raises:
            TypeError: an input is missing or unknown (the message lists the expected names).
        """
        names = self.input_names
        fixed = self.manifest.get("fixed_kwargs", {})
        for name in [n for n in inputs if n in fixed and n not in names]:
            if inputs[name] != fixed[name]:
                raise ValueError(f"{name}={inputs[name]!r} was baked into this export as {fixed[name]!r}; "
                                 f"re-export with {name}={inputs[name]!r} to change it")
            inputs = {k: v for k, v in inputs.items() if k != name}
        missing = [n for n in names if n not in inputs]
        unknown = [n for n in inputs if n not in names]
        if missing or unknown:
            raise TypeError(f"this {self.backend} export takes inputs {names}; missing {missing}, unknown {unknown}")
        import torch.utils._pytree as pytree

        flat = self.runner.run(tuple(inputs[n] for n in names))
        return pytree.tree_unflatten(list(flat), self.out_spec)

    def verify(self, inputs: Mapping[str, Any], *, atol: float = 1e-5, rtol: float = 1e-5,
               reference: Callable[..., Any] | None = None) -> VerificationReport:
        """Run ``inputs`` on the runtime and on eager PyTorch; report the max abs diff of every output.

        Args:
            inputs: forward keyword arguments (may differ in shape from the traced ones along dynamic dims).
            atol: absolute tolerance.
            rtol: relative tolerance.
            reference: the eager model; defaults to the one exported in this process. The export's fixed
                keyword arguments (``manifest["fixed_kwargs"]``, e.g. ``use_cache=False``) are added.

        Raises:
            ValueError: no eager reference is available (after :func:`load`, pass ``reference=model``).
        """
        import torch

        if reference is not None:
            fixed = self.manifest.get("fixed_kwargs", {})
            model = reference
            reference = lambda **kw: model(**kw, **fixed)  # noqa: E731
        reference = reference or self.reference
        if reference is None:
            raise ValueError("no eager model to compare against: pass verify(inputs, reference=model)")
        with torch.no_grad():
            expected = reference(**copy.deepcopy(dict(inputs)))
            actual = self(**copy.deepcopy(dict(inputs)))
        return compare_outputs(self.backend, expected, actual, atol, rtol)

    # ── saving ────────────────────────────────────────────────────────────────────────────────────────
    def save_pretrained(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the program file(s), ``export.json`` and the model config into directory ``path``.

        Atomic: everything is written into a temporary directory beside ``path`` and moved into place;
        a failure leaves no artifact (and an existing directory untouched).

        Raises:
            FileExistsError: ``path`` exists and is not empty, and ``overwrite`` is False.
        """
        target = Path(path).absolute()
        if target.exists() and not target.is_dir():
            raise FileExistsError(f"{target} exists and is not a directory")
        if target.exists() and any(target.iterdir()) and not overwrite:
            raise FileExistsError(f"{target} exists and is not empty: choose another directory or pass "
                                  "overwrite=True (CLI: --overwrite)")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the artifact gets the usual permissions
        try:
            files: list[str] = []
            for name, write in self.components.items():
                written = write(staging)
                files.extend(written if isinstance(written, list | tuple) else [name])
            manifest = dict(self.manifest, files=sorted(set(files) | {MANIFEST_NAME}))
            (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
            if target.exists():
                retired = target.with_name(f".{target.name}.{os.getpid()}.old")
                target.rename(retired)
                staging.rename(target)
                shutil.rmtree(retired, ignore_errors=True)
            else:
                staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.manifest = manifest
        return target

    save = save_pretrained

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> ExportedModel:
        """Same as :func:`hfexport.load`."""
        return load(path)


def read_manifest(path: Path) -> dict[str, Any]:
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path} is not an hfexport artifact: it has no {MANIFEST_NAME}")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{manifest_path} has schema_version {manifest.get('schema_version')!r}; this hfexport "
                         f"reads version {SCHEMA_VERSION}: re-export, or install the hfexport that wrote it")
    missing = [f for f in manifest.get("files", []) if not (path / f).exists()]
    if missing:
        raise FileNotFoundError(f"{path} lacks files its manifest lists: {missing}")
    return manifest


def load(path: str | os.PathLike[str]) -> ExportedModel:
    """Load a saved artifact and open it on its backend's runtime.

    Raises:
        FileNotFoundError: ``path`` has no ``export.json``, or lacks a file the manifest lists.
        hfexport.UnknownBackendError: the backend that wrote it is not installed (says what to install).
    """
    from ._discovery import get_backend

    path = Path(path)
    manifest = read_manifest(path)
    exporter_class = get_backend(manifest["backend"]).load_exporter()
    runner = exporter_class.load_runner(path, manifest)
    return ExportedModel(manifest["backend"], runner, manifest)
