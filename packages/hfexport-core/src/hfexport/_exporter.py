"""The exporter base class: option validation, input checks, the staged run and model-state safety."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ._stages import ExportError, ProgressCallback, Stage, run_stages

if TYPE_CHECKING:
    import torch

    from ._artifact import ExportedModel

__all__ = ["ExportConfig", "ExportContext", "Exporter", "InvalidInputError"]


class InvalidInputError(TypeError):
    """The model or its inputs cannot be exported as given; the message says what to pass instead."""


@dataclass
class ExportConfig:
    """Options every backend takes. Backends subclass it (``DynamoConfig``, ``OnnxConfig``, ...).

    Attributes:
        dynamic: mark every dimension of every tensor input ``Dim.AUTO`` (torch.export keeps the dims it
            can and specializes the others).
        dynamic_shapes: an explicit ``dynamic_shapes`` for ``torch.export.export``, keyed by input name;
            overrides ``dynamic`` for the inputs it names.
        disable: names of registered workarounds to leave out (``"_fix_ir_topk_sorted"``), to see what one
            fixes or to drop one that misbehaves.
    """

    dynamic: bool = False
    dynamic_shapes: Mapping[str, Any] | None = None
    disable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.dynamic, bool):
            raise TypeError(f"dynamic must be True or False, got {self.dynamic!r}")
        if self.dynamic_shapes is not None and not isinstance(self.dynamic_shapes, Mapping):
            raise TypeError("dynamic_shapes must map input names to per-dimension specs, e.g. "
                            "{'input_ids': {0: Dim('batch'), 1: Dim('seq')}}")
        if isinstance(self.disable, str):
            self.disable = (self.disable,)
        self.disable = tuple(self.disable)

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_options(cls, config: ExportConfig | None = None, **options: Any) -> ExportConfig:
        """Build a config from ``config`` (or the defaults) updated with keyword ``options``.

        Raises:
            TypeError: an option this backend does not take; the message lists those it takes.
        """
        unknown = sorted(set(options) - set(cls.option_names()))
        if unknown:
            raise TypeError(f"{cls.__name__} does not take {', '.join(map(repr, unknown))}; "
                            f"options it takes: {', '.join(cls.option_names())}")
        if config is None:
            return cls(**options)
        if not isinstance(config, cls):
            raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}")
        return dataclasses.replace(config, **options) if options else config


@dataclass
class ExportContext:
    """State passed through the stages of one export.

    Attributes:
        model: the model being exported (restored exactly when the export ends).
        inputs: forward keyword arguments, in the order of the exported signature.
        config: the backend's config.
        stack: contexts entered by stages (patches, state cleanup); closed when the stages end.
        program: the ``torch.export.ExportedProgram`` once traced.
        report: what the export did: installed patches, fixes applied, timings, notes (into the manifest).
        extras: backend-specific results (an ONNX model, a .pte buffer, partitioners ...).
    """

    exporter: Exporter
    model: torch.nn.Module
    inputs: dict[str, Any]
    config: ExportConfig
    stack: contextlib.ExitStack
    progress: ProgressCallback | None = None
    program: Any = None
    report: dict[str, Any] = field(default_factory=lambda: {"patches": [], "skipped_patches": [], "fixes": {},
                                                             "timings": {}, "notes": []})
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def model_class(self) -> str:
        return type(self.model).__name__

    def note(self, text: str) -> None:
        """Record a fact about this export (a fallback taken, a dim specialized) in the manifest."""
        self.report["notes"].append(text)


_WARNED_DRIFT: set[str] = set()


def warn_version_drift(exporter_class: type[Exporter]) -> list[str]:
    """Warn once per distribution whose installed major.minor differs from ``exporter_class.tested_versions``.

    Returns:
        The drift messages (also for distributions warned about earlier).
    """
    import os
    import warnings
    from importlib import metadata

    messages = []
    for dist, tested in exporter_class.tested_versions.items():
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if installed.split(".")[:2] != tested.split(".")[:2]:
            messages.append(f"{dist} {installed} is installed; {exporter_class.name} was tested with {tested}")
            if dist not in _WARNED_DRIFT and not os.environ.get("HFEXPORT_IGNORE_VERSION_DRIFT"):
                _WARNED_DRIFT.add(dist)
                warnings.warn(messages[-1] + " (set HFEXPORT_IGNORE_VERSION_DRIFT=1 to silence)", stacklevel=3)
    return messages


def _snapshot_modes(model: Any) -> list[tuple[Any, bool]]:
    return [(m, m.training) for m in model.modules()]


class Exporter:
    """Base class of every backend's exporter.

    A subclass declares ``name``, ``config_class``, ``stages`` (the :class:`Stage` list, whose ``method``
    names its own methods), ``scopes`` (the workaround scopes it activates) and implements
    :meth:`package` (build the artifact) and :meth:`load_runner` (reopen a saved one).
    """

    name: ClassVar[str] = "base"
    config_class: ClassVar[type[ExportConfig]] = ExportConfig
    stages: ClassVar[tuple[Stage, ...]] = ()
    scopes: ClassVar[tuple[str, ...]] = ()
    # Distributions whose versions go into the manifest.
    toolchain: ClassVar[tuple[str, ...]] = ("torch",)
    # Versions this backend was tested with; a different major.minor installed gets one warning per process
    # (silence it with HFEXPORT_IGNORE_VERSION_DRIFT=1).
    tested_versions: ClassVar[dict[str, str]] = {}

    def __init__(self, config: ExportConfig | None = None, **options: Any):
        self.config = self.config_class.from_options(config, **options)

    # ── public ────────────────────────────────────────────────────────────────────────────────────────
    @classmethod
    def describe_stages(cls) -> list[dict[str, Any]]:
        """The stages as data: number, title, extension point, and the toolchain call each makes."""
        return [{"number": s.number, "title": s.title, "extension_point": s.extension_point, "runs": s.runs}
                for s in cls.stages]

    def export(self, model: Any, inputs: Mapping[str, Any] | None = None, *,
               progress: ProgressCallback | None = None) -> ExportedModel:
        """Run the stages on ``model`` and package the result.

        Raises:
            InvalidInputError: ``model`` is not an ``nn.Module`` or ``inputs`` is not a mapping of tensors
                and caches.
            ExportError: a stage failed (the original exception is chained).
        """
        import torch

        if not isinstance(model, torch.nn.Module):
            raise InvalidInputError(f"model must be a torch.nn.Module, got {type(model).__name__}; "
                                    "load it first, e.g. AutoModel.from_pretrained(path)")
        model_class = type(model).__name__
        try:
            inputs = self.prepare_inputs(model, inputs)
        except InvalidInputError:
            raise
        except Exception as exc:
            raise ExportError(self.name, model_class, exc, where="building inputs from the config",
                              hints=["pass inputs explicitly: a mapping of forward keyword arguments"]) from exc
        self.check_inputs(inputs)
        warn_version_drift(type(self))
        modes = _snapshot_modes(model)
        start = time.perf_counter()
        try:
            with contextlib.ExitStack() as stack:
                ctx = ExportContext(self, model, inputs, self.config, stack, progress)
                model.eval()
                ctx.report["timings"].update(run_stages(self.name, self.stages, self, ctx, model_class, progress))
            ctx.report["timings"]["total"] = round(time.perf_counter() - start, 4)
            try:
                return self.package(ctx)
            except Exception as exc:
                raise ExportError(self.name, model_class, exc, where="packaging (after the last stage)",
                                  hints=["all stages passed; please report this with the traceback"]) from exc
        finally:
            for module, training in modes:
                module.training = training

    def check_inputs(self, inputs: Any) -> None:
        """Raise :class:`InvalidInputError` unless ``inputs`` maps names to tensors or pytrees of tensors.

        Runs before the first stage, so that bad input costs no work. Backends that accept more container
        types register them as pytree nodes first (the dynamo backend registers transformers' caches).
        """
        import torch
        import torch.utils._pytree as pytree

        if not isinstance(inputs, Mapping):
            raise InvalidInputError(f"inputs must be a mapping of forward keyword arguments to tensors, e.g. "
                                    f"{{'input_ids': tensor}}; got {type(inputs).__name__}")
        for name, value in inputs.items():
            if not isinstance(name, str):
                raise InvalidInputError(f"input names must be strings, got {name!r}")
            leaves = pytree.tree_leaves(value)
            bad = [type(leaf).__name__ for leaf in leaves
                   if not isinstance(leaf, torch.Tensor | int | float | bool | type(None))]
            if bad or not leaves and value is not None:
                raise InvalidInputError(
                    f"input {name!r} is a {type(value).__name__} holding {', '.join(bad) or 'nothing'}; inputs "
                    "must be tensors, Cache objects or nested lists/tuples/dicts of tensors (register other "
                    "containers as pytree nodes, e.g. hfexport_dynamo.register_cache_type)")

    # ── for subclasses ────────────────────────────────────────────────────────────────────────────────
    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any]:
        """The inputs to trace with; the base class requires them."""
        if inputs is None:
            raise InvalidInputError(f"backend {self.name!r} needs inputs for {type(model).__name__}")
        if not isinstance(inputs, Mapping):
            raise InvalidInputError(f"inputs must be a mapping of forward keyword arguments to tensors, got "
                                    f"{type(inputs).__name__}")
        return dict(inputs)

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        """Next steps for a failure in ``stage``; empty means the kernel's generic hints."""
        return []

    def package(self, ctx: ExportContext) -> ExportedModel:
        raise NotImplementedError(f"{type(self).__name__} must implement package()")

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any]) -> Any:
        """Reopen a saved artifact's program on its runtime; returns a runner (see ``ExportedModel``)."""
        raise NotImplementedError(f"{cls.__name__} must implement load_runner()")

    @classmethod
    def load_model(cls, path: str | Path) -> Any:
        """Load a model from a directory, for the CLI."""
        raise NotImplementedError(f"{cls.__name__} cannot load models from a directory")

    @classmethod
    def backend_workarounds(cls) -> list[dict[str, str]]:
        """Workarounds kept outside the kernel registries (ONNX translations, IR fixes): kind, name, summary."""
        return []

    @classmethod
    def sample_inputs(cls, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Inputs to verify a saved export with: another shape along its dynamic dims, else the traced one."""
        return None

    @classmethod
    def demo(cls) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """``(model, inputs, second_inputs)`` for ``hfexport export --demo``."""
        raise NotImplementedError(f"{cls.__name__} has no demo model")
