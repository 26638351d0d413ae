"""The exporter base class: option validation, input checks, the staged run, model-state safety, and the
export context through which stages install patches, apply fixes and record what they did."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ._artifact import DEFAULT_COMPONENT, SCHEMA_VERSION, Component, ExportedModel, versions_of
from ._fx import FixReport, apply_fx_node_fixes, apply_fx_program_fixes
from ._patching import PatchReport, patch_context
from ._registry import Registration, workarounds_for
from ._stages import ExportError, ProgressCallback, Stage, StepRecorder, run_stages

if TYPE_CHECKING:
    import torch

__all__ = ["ExportConfig", "ExportContext", "Exporter", "InvalidInputError", "Tracer"]


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
        steps: times the toolchain calls of the stages (``with ctx.step("torch.onnx.export"): ...``).
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
    steps: StepRecorder = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.steps is None:
            self.steps = StepRecorder(self.progress)

    @property
    def model_class(self) -> str:
        return type(self.model).__name__

    def note(self, text: str) -> None:
        """Record a fact about this export (a fallback taken, a dim specialized) in the manifest."""
        self.report["notes"].append(text)

    def step(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Run a toolchain call (``"torch.export.export"``) as a named, timed step of the current stage;
        a failure inside it names the step in the :class:`ExportError`."""
        return self.steps(name)

    def workarounds(self, kind: str, scopes: Iterable[str]) -> list[Registration]:
        """The registrations of ``kind`` for ``scopes``, minus those this export's config disables."""
        return workarounds_for(kind, scopes, self.config.disable)

    def install_patches(self, scopes: Sequence[str]) -> PatchReport:
        """Install the patches of ``scopes`` until the export ends (factories with a ``ctx`` parameter get this
        context); record what was installed or skipped."""
        report = self.stack.enter_context(patch_context(tuple(scopes), self.config.disable, ctx=self))
        self.report["patches"].extend(r.as_dict() | {"path": p} for r, p in report.installed)
        self.report["skipped_patches"].extend(r.as_dict() | {"path": p, "reason": why}
                                              for r, p, why in report.skipped)
        return report

    def apply_fx_node_fixes(self, graph_module: Any, scopes: Iterable[str]) -> FixReport:
        """Apply the FX node fixes of ``scopes`` (fixes with a ``ctx`` parameter get this context); record them."""
        report = apply_fx_node_fixes(graph_module, self.workarounds("fx_node_fix", scopes), ctx=self)
        self.record_fixes(report)
        return report

    def apply_fx_program_fixes(self, program: Any, scopes: Iterable[str]) -> FixReport:
        """Apply the FX program fixes of ``scopes`` to ``program`` in place; record them."""
        report = apply_fx_program_fixes(program, self.workarounds("fx_program_fix", scopes), ctx=self)
        self.record_fixes(report)
        return report

    def record_fixes(self, report: FixReport) -> None:
        for name, count in report.applied.items():
            self.record_applied(name, count)

    def record_applied(self, name: str, count: int = 1) -> None:
        """Count a workaround that fired (a translation used, an IR fix that rewrote nodes) in the manifest."""
        fixes = self.report["fixes"]
        fixes[name] = fixes.get(name, 0) + count


class Tracer(Protocol):
    """What a backend gets from the package that traces models (hfexport-dynamo's ``DYNAMO_TRACER``).

    The kernel names no tracer: an exporter sets ``tracer`` and the base class delegates to it.
    """

    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any] | None: ...

    def check_inputs(self, inputs: Mapping[str, Any]) -> None: ...

    def program_manifest(self, ctx: ExportContext, program: Any) -> dict[str, Any]: ...

    def extra_files(self, ctx: ExportContext) -> dict[str, Any]: ...

    def reference(self, ctx: ExportContext) -> Any: ...

    def sample_inputs(self, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None: ...

    def load_model(self, path: str | Path) -> Any: ...

    def prepare_load(self, manifest: dict[str, Any]) -> None: ...


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


# One lock per model instance: an export switches the model to eval mode and restores its training flags at
# the end, so a second export of the same instance in another thread would snapshot (and restore) the first
# one's eval mode, or trace after the first restored train() and bake dropout in. Different instances export
# concurrently (their traces still take turns on the patch context's lock).
_MODEL_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_MODEL_LOCKS_BY_ID: dict[int, threading.RLock] = {}  # models that cannot be weak keys (unhashable)
_MODEL_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _model_lock(model: Any) -> Any:
    """Hold ``model``'s export lock; wait while another thread exports the same instance.

    Raises:
        RuntimeError: the instance is being exported by another thread and this thread holds the patch
            context that export waits for (waiting would deadlock).
    """
    from ._patching import _PATCH_LOCK

    with _MODEL_LOCKS_GUARD:
        try:
            lock = _MODEL_LOCKS.get(model)
            if lock is None:
                lock = _MODEL_LOCKS[model] = threading.RLock()
        except TypeError:
            lock = _MODEL_LOCKS_BY_ID.setdefault(id(model), threading.RLock())
    if not lock.acquire(blocking=False):
        owns_patches = getattr(_PATCH_LOCK, "_is_owned", lambda: False)()
        if owns_patches:
            raise RuntimeError(f"this {type(model).__name__} instance is being exported by another thread, which "
                               "waits for the patch context this thread holds: exporting it here would deadlock; "
                               "export it outside the patch context, or after the other export")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class Exporter:
    """Base class of every backend's exporter.

    A subclass declares ``name``, ``config_class``, ``stages`` (the :class:`Stage` list, whose ``method``
    names its own methods), ``scopes`` (the workaround scopes it activates) and ``tracer`` (what turns a
    model into a program and describes it: ``hfexport_dynamo.DYNAMO_TRACER``), and implements
    :meth:`package` (build the artifact, usually with :meth:`artifact`) and :meth:`load_runner` (reopen a
    saved component).
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
    tracer: ClassVar[Tracer | None] = None

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
        with _model_lock(model):  # a second export of this instance in another thread waits for this one
            modes = _snapshot_modes(model)
            start = time.perf_counter()
            try:
                with contextlib.ExitStack() as stack:
                    ctx = ExportContext(self, model, inputs, self.config, stack, progress)
                    model.eval()
                    ctx.report["timings"].update(run_stages(self.name, self.stages, self, ctx, model_class,
                                                            progress))
                ctx.report["timings"].update(ctx.steps.timings)
                ctx.report["timings"]["total"] = round(time.perf_counter() - start, 4)
                try:
                    return self.package(ctx)
                except Exception as exc:
                    raise ExportError(self.name, model_class, exc, where="packaging (after the last stage)",
                                      internal=True) from exc
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

        if self.tracer is not None:
            self.tracer.check_inputs(inputs)
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

    # ── for subclasses (the tracer's answers unless overridden) ───────────────────────────────────────
    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any]:
        """The inputs to trace with: the given ones, or the tracer's (built from the model's config)."""
        if inputs is None and self.tracer is not None:
            built = self.tracer.prepare_inputs(model, None)
            if built is not None:
                return built
        if inputs is None:
            raise InvalidInputError(f"backend {self.name!r} needs inputs for {type(model).__name__}: pass a "
                                    "mapping of forward keyword arguments")
        if not isinstance(inputs, Mapping):
            raise InvalidInputError(f"inputs must be a mapping of forward keyword arguments to tensors, got "
                                    f"{type(inputs).__name__}")
        return dict(inputs)

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        """Next steps for a failure in ``stage``; empty means the kernel's generic hints."""
        return []

    def package(self, ctx: ExportContext) -> ExportedModel:
        raise NotImplementedError(f"{type(self).__name__} must implement package()")

    def artifact(self, ctx: ExportContext, components: Sequence[Component], **extra: Any) -> ExportedModel:
        """The :class:`ExportedModel` of ``components``, with the manifest every backend shares.

        Each component's manifest section is completed with the tracer's description of its program
        (inputs, outputs, output spec); the default component's section is also merged at the top level.
        ``extra`` adds top-level manifest keys.
        """
        sections = {}
        for component in components:
            program = component.program if component.program is not None else ctx.program
            described = self.tracer.program_manifest(ctx, program) if self.tracer and program is not None else {}
            component.manifest = {**described, **component.manifest}
            sections[component.name] = component.manifest
        default = sections.get(DEFAULT_COMPONENT) or next(iter(sections.values()))
        manifest = {**self.base_manifest(ctx), **default, "components": sections, **extra}
        extra_files = self.tracer.extra_files(ctx) if self.tracer else {}
        return ExportedModel(self.name, components, manifest, extra_files=extra_files,
                             reference=self.reference(ctx))

    def base_manifest(self, ctx: ExportContext) -> dict[str, Any]:
        """The ``export.json`` keys every backend writes: schema, model, config, versions, workarounds, timings."""
        return {
            "schema_version": SCHEMA_VERSION,
            "backend": self.name,
            "model_class": ctx.model_class,
            "model_module": type(ctx.model).__module__,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "dynamic": ctx.config.dynamic,
            "config": {k: repr(v) for k, v in vars(ctx.config).items()},
            "versions": versions_of(self.toolchain),
            "tested_versions": dict(self.tested_versions),
            "workarounds": {"patches": ctx.report["patches"], "skipped_patches": ctx.report["skipped_patches"],
                            "fixes": ctx.report["fixes"]},
            "timings_s": ctx.report["timings"],
            "notes": ctx.report["notes"],
        }

    def reference(self, ctx: ExportContext) -> Any:
        """The eager callable outputs are verified against (the model, with the export's fixed kwargs)."""
        return self.tracer.reference(ctx) if self.tracer else ctx.model

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = DEFAULT_COMPONENT) -> Any:
        """Reopen one saved component's program on its runtime; returns a runner (``run(args) -> list``).

        ``manifest["components"][component]`` is that component's section.
        """
        raise NotImplementedError(f"{cls.__name__} must implement load_runner()")

    @classmethod
    def load_model(cls, path: str | Path) -> Any:
        """Load a model from a directory, for the CLI."""
        if cls.tracer is None:
            raise NotImplementedError(f"{cls.__name__} cannot load models from a directory")
        return cls.tracer.load_model(path)

    @classmethod
    def sample_inputs(cls, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Inputs to verify a saved export with: another shape along its dynamic dims, else the traced one."""
        return cls.tracer.sample_inputs(model, manifest) if cls.tracer else None

    @classmethod
    def known_failures(cls) -> dict[str, dict[str, str]]:
        """Known-failure lists: list name -> {model class: the upstream bug or model-side change it waits for}.

        The sweep reads them (and re-checks each entry with :meth:`recheck_options`); they should shrink.
        """
        return {}

    @classmethod
    def recheck_options(cls, list_name: str, model_class: str) -> dict[str, Any]:
        """Config options that re-check one entry of a known-failure list (the workaround turned off)."""
        return {}
