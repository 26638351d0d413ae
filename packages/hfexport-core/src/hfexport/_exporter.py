"""The exporter base class: option validation, input checks, the staged run, model-state safety, and the
export context through which stages install patches, apply fixes and record what they did."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from ._artifact import DEFAULT_COMPONENT, SCHEMA_VERSION, Component, ExportedModel, versions_of
from ._fx import FixReport, apply_fx_node_fixes, apply_fx_program_fixes
from ._patching import PatchReport, UnresolvedPatchWarning, is_user_registration, patch_context
from ._registry import Registration, list_workarounds, workarounds_for
from ._stages import ExportError, ProgressCallback, Stage, StepRecorder, run_stages

logger = logging.getLogger("hfexport")

if TYPE_CHECKING:
    import torch

__all__ = ["ExportConfig", "ExportContext", "Exporter", "InvalidInputError", "Tracer"]


class InvalidInputError(TypeError):
    """The model or its inputs cannot be exported as given; the message says what to pass instead."""


_State = TypeVar("_State")  # a backend's state class (ExportContext.state_as)
_Config = TypeVar("_Config", bound="ExportConfig")  # a backend's config class (config_as)


def _config_as(config: Any, kind: type[_Config], owner: str) -> _Config:
    if not isinstance(config, kind):
        raise TypeError(f"{owner} config is an instance of {type(config).__name__}, not of {kind.__name__}")
    return config


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
            raise TypeError(f"dynamic must be True or False, got {self.dynamic!r} ({type(self.dynamic).__name__})")
        if self.dynamic_shapes is not None and not isinstance(self.dynamic_shapes, Mapping):
            raise TypeError(f"dynamic_shapes must map input names to per-dimension specs, e.g. "
                            f"{{'input_ids': {{0: Dim('batch'), 1: Dim('seq')}}}}; got {type(self.dynamic_shapes).__name__}")
        bad_keys = [k for k in self.dynamic_shapes or {} if not isinstance(k, str)]
        if bad_keys:
            raise TypeError(f"dynamic_shapes is keyed by input name (a str), got keys {bad_keys!r}")
        if isinstance(self.disable, str):
            self.disable = (self.disable,)
        if self.disable is None or not isinstance(self.disable, Iterable):
            raise TypeError(f"disable must be a tuple of workaround names, got {self.disable!r}")
        self.disable = tuple(self.disable)
        bad = [d for d in self.disable if not isinstance(d, str)]
        if bad:
            raise TypeError(f"disable holds workaround names (str), e.g. ('_fix_ir_topk_sorted',); got {bad!r}")

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
        trace: the tracer's typed state for this export (``hfexport_dynamo.TraceState``: the dynamic shapes, the
            forward constants baked in ...), set by the tracer's stages.
        state: the backend's typed state for this export (a dataclass of what its stages hand on: an ONNX model,
            a runner, a manifest section ...), made by :meth:`Exporter.new_state` before the first stage.
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
    trace: Any = None
    state: Any = None
    steps: StepRecorder = field(init=False)  # the toolchain steps' timer, reporting to ``progress``

    def __post_init__(self) -> None:
        self.steps = StepRecorder(self.progress)

    @property
    def model_class(self) -> str:
        return type(self.model).__name__

    def state_as(self, kind: type[_State]) -> _State:
        """:attr:`state`, checked to be a ``kind`` (the backend's state class) and typed as one.

        Raises:
            TypeError: this export's state is not a ``kind`` (the context of another backend's export).
        """
        if not isinstance(self.state, kind):
            raise TypeError(f"expected the context of an export whose state is a {kind.__name__}; got "
                            f"{type(self.state).__name__} from {type(self.exporter).__name__}")
        return self.state

    def config_as(self, kind: type[_Config]) -> _Config:
        """:attr:`config`, checked to be a ``kind`` (the backend's config class) and typed as one.

        Raises:
            TypeError: this export's config is not a ``kind`` (the context of another backend's export).
        """
        return _config_as(self.config, kind, "this export's")

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


def _as_json(value: Any) -> Any:
    """``value`` as JSON where it is plain data (bools, numbers, strings, lists, dicts); its repr otherwise."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_as_json(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _as_json(v) for k, v in value.items()}
    return repr(value)


class Tracer(Protocol):
    """What a backend gets from the package that traces models (hfexport-dynamo's ``DYNAMO_TRACER``).

    The kernel names no tracer: an exporter sets ``tracer`` and the base class delegates to it. A tracer may
    declare ``scopes``, the workaround scopes its trace installs (``("dynamo",)``): an exporter's
    :meth:`Exporter.active_scopes` (what ``disable=`` is checked against) includes them.
    """

    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any] | None: ...

    def check_inputs(self, inputs: Mapping[str, Any], model: Any = None) -> None:
        """Raise ``InvalidInputError`` for inputs ``model`` cannot take (before any stage runs)."""

    def program_manifest(self, ctx: ExportContext, program: Any) -> dict[str, Any]: ...

    def extra_files(self, ctx: ExportContext) -> dict[str, Any]: ...

    def reference(self, ctx: ExportContext) -> Any: ...

    def sample_inputs(self, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None: ...

    # Optional: inputs at a second shape for the export's verification (each dynamic size moved by one within its
    # range); None where there is none. The kernel calls it when the tracer has it.
    # def second_shape_inputs(self, ctx: ExportContext, inputs: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def load_model(self, path: str | Path) -> Any: ...

    def prepare_load(self, manifest: dict[str, Any], *, trust_remote_code: bool = False) -> None:
        """Before a saved artifact is opened: register the pytree types its output specs name that the
        tracer's allow-list admits (never an import by a name from the manifest, unless ``trust_remote_code``)."""


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


def _exporter_classes() -> list[type[Exporter]]:
    """Every imported :class:`Exporter` subclass (a backend's config class is known once its module is imported)."""
    out, todo = [], list(Exporter.__subclasses__())
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def _backends_of(config_class: type) -> list[str]:
    return sorted({c.name for c in _exporter_classes() if c.config_class is config_class and c.name != "base"})


def _check_config_class(exporter_class: type[Exporter], config: Any) -> None:
    """Refuse a config object that is not this backend's: an ``OnnxConfig`` given to the dynamo backend (a
    subclass of its config whose extra options it would silently ignore), or a config of another family."""
    if config is None:
        return
    expected = exporter_class.config_class
    if type(config) is expected:
        return
    if isinstance(config, expected) and {f.name for f in dataclasses.fields(config)} == set(expected.option_names()):
        return  # a subclass that adds no option (other defaults): nothing would be ignored
    owners = _backends_of(type(config))
    of = f" (the config of backend {', '.join(map(repr, owners))})" if owners else ""
    if isinstance(config, expected):
        extra = [n for n in type(config).option_names() if n not in expected.option_names()]
        why = f"; backend {exporter_class.name!r} would ignore its options {', '.join(extra)}"
    else:
        why = ""
    use = f", or export with backend={owners[0]!r}" if owners else ""
    raise TypeError(f"backend {exporter_class.name!r} takes a config of type {expected.__name__}, got "
                    f"{type(config).__name__}{of}{why}: pass {expected.__name__}(...){use}")


def _known_scopes() -> set[str]:
    """The scopes the imported exporters install (their own and their tracers')."""
    scopes: set[str] = set()
    for cls in _exporter_classes():
        scopes.update(getattr(cls.tracer, "scopes", ()), cls.scopes)
    return scopes


def unresolved_scope(scope: str) -> str | None:
    """Why no installed backend installs workarounds of ``scope``, or ``None`` when one does (or may).

    A scope resolves when an imported exporter installs it. When no imported exporter belongs to the scope's
    family (its first dotted part), an installed backend of that family (``onnx``, ``executorch-*``) is
    given the benefit of the doubt: its scopes are known only once it is imported.
    """
    from importlib import metadata

    known = _known_scopes()
    if scope in known:
        return None
    family = scope.split(".")[0]
    installed = {ep.name.split("-")[0] for ep in metadata.entry_points(group="hfexport.backends")}
    if family in installed and family not in {s.split(".")[0] for s in known}:
        return None
    close = difflib.get_close_matches(scope, sorted(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    return (f"no installed backend installs scope {scope!r} ({hint}scopes: {', '.join(sorted(known))})")


_CHECKED_SCOPES: set[tuple[str, str, str]] = set()


def warn_unresolved_scopes() -> list[str]:
    """Warn (:class:`UnresolvedPatchWarning`, once per registration) about workarounds registered outside
    hfexport whose scope no installed backend installs: they would never be applied.

    Returns:
        The messages of this call's warnings.
    """
    import warnings

    messages = []
    for r in list_workarounds():
        key = (r.kind, r.qualified_name, r.scope)
        if key in _CHECKED_SCOPES or not is_user_registration(r):
            continue
        _CHECKED_SCOPES.add(key)
        why = unresolved_scope(r.scope)
        if why:
            messages.append(f"{r.kind} {r.qualified_name} is never applied: {why}")
            warnings.warn(messages[-1], UnresolvedPatchWarning, stacklevel=3)
    return messages


def _snapshot_modes(model: Any) -> list[tuple[Any, bool]]:
    return [(m, m.training) for m in model.modules()]


def _save_buffers(model: Any) -> list[tuple[Any, str, Any, Any]]:
    """Every buffer of ``model`` with a copy of its value, for :func:`_restore_buffers` after an eager call (the
    export's verification leaves the model as it was, also one whose forward mutates buffers)."""
    return [(m, name, b, b.detach().clone()) for m in model.modules() for name, b in m._buffers.items()
            if b is not None]


def _restore_buffers(saved: list[tuple[Any, str, Any, Any]]) -> bool:
    """Put back what :func:`_save_buffers` saved; whether any buffer had changed (or been replaced)."""
    import torch

    changed = False
    with torch.no_grad():
        for module, name, buffer, value in saved:
            if module._buffers.get(name) is not buffer:
                module._buffers[name] = buffer
                changed = True
            if not torch.equal(buffer, value):
                buffer.copy_(value)
                changed = True
    return changed


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
    # The tolerances of the verification every export runs (|exported - eager| <= atol + rtol * |eager|,
    # elementwise; integers equal): 1e-4 / 1e-3 are the figures the conformance sweep and the field cases verify
    # the tiny-model zoo with on dynamo, ONNX Runtime and ExecuTorch XNNPACK, all float32. A backend that computes
    # in another precision sets its own (executorch-cuda: bfloat16).
    verify_atol: ClassVar[float] = 1e-4
    verify_rtol: ClassVar[float] = 1e-3
    # Whether the runtime keeps the buffers a program mutates from one call to the next, in place (ExecuTorch's
    # mutable buffers). A task plan then keeps state (a KV cache) in the program's buffers; otherwise state crosses
    # the program boundary as inputs and outputs (ONNX has no mutable state; a .pt2 would store the buffers).
    stateful_programs: ClassVar[bool] = False
    # The runtime's fused KV-cache attention, which reads only the positions filled so far instead of the cache's
    # whole capacity. True: the backend lowers ``hfexport::cache_attention`` (hfexport_dynamo._cache_attention: a
    # cache write and the attention, one functional op; ONNX Runtime's GroupQueryAttention). A stateful backend may
    # give a kernel instead, ``hfexport_dynamo.generation.InPlaceCacheAttention`` (as a staticmethod), that writes
    # the cache buffers in place (ExecuTorch's llama::update_cache + llama::custom_sdpa). False: none.
    fused_cache_attention: ClassVar[Any] = False

    def __init__(self, config: ExportConfig | None = None, **options: Any):
        """Raises:
            TypeError: ``config`` is the config of another backend (the message names both), an option this
                backend does not take, or an option of the wrong type.
        """
        _check_config_class(type(self), config)
        self.config = self.config_class.from_options(config, **options)

    def config_as(self, kind: type[_Config]) -> _Config:
        """:attr:`config`, checked to be a ``kind`` (the backend's config class) and typed as one.

        Raises:
            TypeError: this exporter's config is not a ``kind``.
        """
        return _config_as(self.config, kind, f"this {type(self).__name__}'s")

    def cache_attention(self) -> Any:
        """The fused KV-cache attention this export lowers (:attr:`fused_cache_attention`, unless the config turns
        it off: ONNX's ``ort_fusions=None`` writes plain ONNX ops)."""
        return self.fused_cache_attention

    def new_state(self, ctx: ExportContext) -> Any:
        """The typed state the stages of one export hand on (a dataclass of the backend's own), kept in
        ``ctx.state``; None by default (a backend whose stages hand on nothing but ``ctx.program``)."""
        return None

    @classmethod
    def nested(cls, config: ExportConfig) -> Exporter:
        """An exporter that runs this backend's stages inside another backend's export, with that export's
        ``config`` (an instance of this backend's ``config_class`` or of a subclass, e.g. an ``OnnxConfig``
        for the dynamo stages that ``hfexport_dynamo.trace`` runs)."""
        if not isinstance(config, cls.config_class):
            raise TypeError(f"{cls.__name__} runs nested with a {cls.config_class.__name__} (or a subclass), "
                            f"got {type(config).__name__}")
        exporter = cls.__new__(cls)
        exporter.config = config
        return exporter

    def active_scopes(self) -> tuple[str, ...]:
        """The workaround scopes an export of this backend may install: its own and its tracer's."""
        return tuple(dict.fromkeys((*getattr(self.tracer, "scopes", ()), *self.scopes)))

    def check_disable(self) -> None:
        """Raise ``ValueError`` when ``config.disable`` names no workaround of this backend's scopes.

        Every kind counts (patches, fixes, translations, variants); a scope covers its sub-scopes
        (``"executorch"`` covers ``"executorch.cuda"``). The message lists close matches.
        """
        if not self.config.disable:
            return
        scopes = self.active_scopes()
        known = [r for r in list_workarounds()
                 if any(r.scope == s or r.scope.startswith(s + ".") for s in scopes)]
        short, qualified = sorted({r.name for r in known}), sorted({r.qualified_name for r in known})
        unknown = [d for d in self.config.disable if d not in short and d not in qualified]
        if not unknown:
            return
        parts = []
        for name in unknown:
            close = difflib.get_close_matches(name, qualified if "." in name else short, n=3, cutoff=0.6)
            parts.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
        raise ValueError(f"disable names no workaround of backend {self.name!r}: {', '.join(parts)}; its "
                         f"{len(short)} workarounds are listed by `hfexport workarounds --scope SCOPE` for "
                         f"the scopes {', '.join(scopes)}")

    # ── public ────────────────────────────────────────────────────────────────────────────────────────
    @classmethod
    def describe_stages(cls) -> list[dict[str, Any]]:
        """The stages as data: number, title, extension point, and the toolchain call each makes."""
        return [{"number": s.number, "title": s.title, "extension_point": s.extension_point, "runs": s.runs}
                for s in cls.stages]

    def export(self, model: Any, inputs: Mapping[str, Any] | None = None, *,
               progress: ProgressCallback | None = None, task: str | None = None, verify: bool = True,
               atol: float | None = None, rtol: float | None = None, **task_options: Any) -> ExportedModel:
        """Run the stages on ``model``, package the result and verify it (see :meth:`verify_export`).

        With a ``task``, the tracer plans the programs the task runs and each is exported (and verified against
        the module it wraps) in turn (see :func:`hfexport._tasks.export_task`); ``task_options`` are the
        tracer's (``max_cache_len``).

        Args:
            verify: raise :class:`VerificationError` when the artifact's outputs differ from eager PyTorch on the
                traced inputs; ``False`` returns the artifact anyway (the verification still runs and its report,
                ``passed`` true or false, is in the manifest).
            atol: the verification's absolute tolerance (default :attr:`verify_atol`).
            rtol: its relative tolerance (default :attr:`verify_rtol`).

        Raises:
            InvalidInputError: ``model`` is not an ``nn.Module`` or ``inputs`` is not a mapping of tensors
                and caches (or holds one the model cannot take: see :meth:`check_inputs`).
            TypeError: ``verify`` is not a bool, or ``atol``/``rtol`` not a non-negative number.
            ValueError: ``disable`` names a workaround this backend does not have (close matches listed).
            ExportError: a stage failed (the original exception is chained), or, with ``verify``, the artifact or
                the eager model could not run on the traced inputs.
            VerificationError: with ``verify``, the outputs differ beyond the tolerances.
        """
        import torch

        atol, rtol = self._check_verify_options(verify, atol, rtol)
        if not isinstance(model, torch.nn.Module):
            raise InvalidInputError(f"model must be a torch.nn.Module, got {type(model).__name__}; "
                                    "load it first, e.g. AutoModel.from_pretrained(path)")
        if task is not None:
            from ._tasks import export_task

            with _model_lock(model):
                return export_task(self, model, task, inputs, progress=progress, verify=verify, atol=atol,
                                   rtol=rtol, **task_options)
        if task_options:
            raise TypeError(f"{', '.join(sorted(task_options))} are options of a task export: pass task=...")
        self.check_disable()
        warn_unresolved_scopes()
        model_class = type(model).__name__
        try:
            inputs = self.prepare_inputs(model, inputs)
        except InvalidInputError:
            raise
        except Exception as exc:
            raise ExportError(self.name, model_class, exc, where="building inputs from the config",
                              hints=["pass inputs explicitly: a mapping of forward keyword arguments"]) from exc
        self.check_inputs(inputs, model)
        warn_version_drift(type(self))
        with _model_lock(model):  # a second export of this instance in another thread waits for this one
            modes = _snapshot_modes(model)
            start = time.perf_counter()
            try:
                with contextlib.ExitStack() as stack:
                    ctx = ExportContext(self, model, inputs, self.config, stack, progress)
                    ctx.state = self.new_state(ctx)
                    model.eval()
                    ctx.report["timings"].update(run_stages(self.name, self.stages, self, ctx, model_class,
                                                            progress))
                ctx.report["timings"].update(ctx.steps.timings)
                ctx.report["timings"]["total"] = round(time.perf_counter() - start, 4)
                try:
                    exported = self.package(ctx)
                except Exception as exc:
                    raise ExportError(self.name, model_class, exc, where="packaging (after the last stage)",
                                      internal=True) from exc
                # In eval mode still, with every patch reverted and the model back on its device and dtype.
                self.verify_export(exported, ctx, inputs, atol=atol, rtol=rtol, raise_on_mismatch=verify)
                return exported
            finally:
                for module, training in modes:
                    module.training = training

    def _check_verify_options(self, verify: Any, atol: Any, rtol: Any) -> tuple[float, float]:
        """The verification's tolerances (the backend's defaults where ``None``); refuses options of the wrong type."""
        if not isinstance(verify, bool):  # "no" is truthy
            raise TypeError(f"verify must be True or False, got {verify!r} ({type(verify).__name__})")
        out = []
        for name, value, default in (("atol", atol, self.verify_atol), ("rtol", rtol, self.verify_rtol)):
            if value is None:
                value = default
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise TypeError(f"{name} must be a non-negative number (the verification's tolerance), got "
                                f"{value!r} ({type(value).__name__})")
            out.append(float(value))
        return out[0], out[1]

    def verify_export(self, exported: ExportedModel, ctx: ExportContext, inputs: Mapping[str, Any], *,
                      atol: float, rtol: float, raise_on_mismatch: bool = True) -> None:
        """Run the packaged artifact once on its runtime and the model once in eager PyTorch, on deep copies of
        the traced ``inputs`` (the export's constants are baked in and added to the eager call), and record the
        report in the manifest (:meth:`ExportedModel.verify_export`; ``timings_s.verification``).

        The model's buffers are put back afterwards; when the eager call changed one (a forward that mutates
        buffers), the artifact's runner is ``reset()`` too, so that both start where they were.

        Raises:
            VerificationError: the outputs differ beyond ``atol``/``rtol`` (only with ``raise_on_mismatch``).
            ExportError: the artifact or the eager model raised (only with ``raise_on_mismatch``; otherwise the
                error is recorded as ``manifest["verification"]["error"]``).
        """
        from ._artifact import VerificationError

        start = time.perf_counter()
        fixed = exported.manifest.get("fixed_kwargs") or {}
        checked = {k: v for k, v in inputs.items() if k not in fixed}
        component = exported.default_component
        saved = _save_buffers(ctx.model)
        try:
            report = exported.verify_export(checked, atol=atol, rtol=rtol)
        except Exception as exc:
            if raise_on_mismatch:
                raise ExportError(self.name, ctx.model_class, exc, where="verification (running the artifact and "
                                  "the eager model on the traced inputs)", hints=[
                                      "export with verify=False to get the artifact without this check, and call "
                                      "it to see the error", "see the full traceback (the error is chained)"]
                                  ) from exc
            failed = {"backend": self.name, "passed": False, "atol": atol, "rtol": rtol,
                      "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
            exported.manifest["verification"] = failed
            exported._section(component)["verification"] = dict(failed, stored=None)
            return
        finally:
            # An eager call that changed a buffer means a program whose runs change their state: reset it.
            mutated = _restore_buffers(saved)
            reset = getattr(component.runner, "reset", None)
            if mutated and callable(reset):
                reset()
            elif mutated:
                import warnings

                warnings.warn(f"the {self.name} runner has no reset(): its program mutates buffers, so the "
                              "verification run advanced the artifact's state by one call", stacklevel=4)
            exported.manifest.setdefault("timings_s", {})["verification"] = round(time.perf_counter() - start, 4)
        if not report.passed and raise_on_mismatch:  # verify=False stays one run of each: no diagnosis
            self._diagnose(ctx, exported, checked, report)
            raise VerificationError(self.name, ctx.model_class, report, exported, component.name)
        if report.passed:
            self._verify_second_shape(ctx, exported, checked, atol=atol, rtol=rtol,
                                      raise_on_mismatch=raise_on_mismatch)

    def _verify_second_shape(self, ctx: ExportContext, exported: ExportedModel, inputs: Mapping[str, Any], *,
                             atol: float, rtol: float, raise_on_mismatch: bool) -> None:
        """Run the artifact and the model once more at the tracer's second shape (each dynamic size moved by one
        within its range, so that its parity differs: :meth:`Tracer.second_shape_inputs`), which catches a
        program that a guard on the sizes specialized to the traced ones; recorded as
        ``verification.second_shape`` in the manifest.

        Raises:
            VerificationError: the outputs differ at the second shape (with ``raise_on_mismatch``).
            ExportError: the artifact or the model raised at the second shape (with ``raise_on_mismatch``).
        """
        from ._artifact import VerificationError

        make = getattr(self.tracer, "second_shape_inputs", None)
        alternate = make(ctx, inputs) if callable(make) else None
        if not alternate:
            return
        component = exported.default_component
        first = exported.manifest.get("verification")
        saved = _save_buffers(ctx.model)
        # the eager call at another shape may also re-fill attributes a forward caches (a rotary table for the
        # last length): the modules' attributes are put back as they were, shallowly
        attributes = [(m, dict(vars(m))) for m in ctx.model.modules()]
        import copy

        import torch

        from ._artifact import _shapes

        error, report = None, None
        shapes = _shapes(alternate)

        def first_line(exc: BaseException) -> str:
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"

        try:
            with torch.no_grad():
                try:
                    expected = exported.reference(**copy.deepcopy(dict(alternate)))
                except Exception as exc:  # inputs the model itself refuses (sizes tied to values): no check
                    expected, record = None, {"passed": None, "inputs": shapes,
                                              "skipped": f"the eager model raised at this shape: {first_line(exc)}"}
                if expected is not None:
                    try:
                        actual = exported(**copy.deepcopy(dict(alternate)))
                        report = exported._comparison(expected, actual, atol, rtol, exported._section(component))
                        report.inputs = shapes
                        record = report.as_dict()
                    except Exception as exc:
                        error, record = exc, {"passed": False, "error": first_line(exc), "inputs": shapes}
        finally:
            reset = getattr(component.runner, "reset", None)
            if _restore_buffers(saved) and callable(reset):  # a forward that mutates buffers: start again
                reset()
            for module, before in attributes:
                for name in set(vars(module)) - set(before):
                    delattr(module, name)
                vars(module).update(before)
            exported.manifest["verification"] = first
        for section in (exported.manifest.get("verification"), exported._section(component).get("verification")):
            if isinstance(section, dict):
                section["second_shape"] = record
        if not raise_on_mismatch or record["passed"] is not False:
            return
        why = ("the traced shape matched eager, this one (every dynamic size moved by one, within its range) does "
               "not: a guard on the sizes specialized the program to the traced ones (their parity, a multiple)")
        if error is not None:
            raise ExportError(self.name, ctx.model_class, error, where="verification at a second shape "
                              f"({', '.join(f'{k}={v}' for k, v in record['inputs'].items())})",
                              hints=[why, "export with verify=False to keep the artifact, or give these dims "
                                     "static sizes or explicit Dim ranges"], internal=False) from error
        report.diagnosis = {"summary": why}
        raise VerificationError(self.name, ctx.model_class, report, exported, component.name)

    def _diagnose(self, ctx: ExportContext, exported: ExportedModel, inputs: Mapping[str, Any],
                  report: Any) -> None:
        """Ask :meth:`diagnose_mismatch` where the failing export goes wrong; record its answer in the report and
        in the manifest (``verification.diagnosis``). A diagnosis that fails is logged, never raised."""
        start = time.perf_counter()
        try:
            diagnosis = self.diagnose_mismatch(ctx, exported, inputs, report)
        except Exception as exc:  # the verification's own answer stands; say why there is no diagnosis
            logger.warning("%s: the diagnosis of the failed verification failed: %s: %s", self.name,
                           type(exc).__name__, exc)
            diagnosis = {"error": f"{type(exc).__name__}: {exc}"}
        if not diagnosis:
            return
        diagnosis = {**diagnosis, "seconds": round(time.perf_counter() - start, 2)}
        report.diagnosis = diagnosis
        exported.manifest.setdefault("verification", {})["diagnosis"] = diagnosis
        exported._section(exported.default_component).setdefault("verification", {})["diagnosis"] = diagnosis

    def diagnose_mismatch(self, ctx: ExportContext, exported: ExportedModel, inputs: Mapping[str, Any],
                          report: Any) -> dict[str, Any] | None:
        """Where a failing export goes wrong, when the backend can find it (called only after its verification
        failed, with the patches of the export reverted): a JSON-ready dict with a one-line ``summary``, which the
        :class:`VerificationError` message adds. None: no diagnosis (the default)."""
        return None

    def check_inputs(self, inputs: Any, model: Any = None) -> None:
        """Raise :class:`InvalidInputError` unless ``inputs`` maps names to tensors or pytrees of tensors, none
        with a zero-size batch, and the tracer accepts them for ``model`` (the dynamo tracer: names forward
        takes, integer token ids).

        Runs before the first stage, so that bad input costs no work. Backends that accept more container
        types register them as pytree nodes first (the dynamo backend registers transformers' caches).
        """
        import torch
        import torch.utils._pytree as pytree

        if self.tracer is not None:
            self.tracer.check_inputs(inputs, model)
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
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == 0:
                raise InvalidInputError(
                    f"input {name!r} has batch size 0 (shape {list(value.shape)}): export with a non-empty "
                    "example; batch 2 or more keeps the batch dim dynamic with dynamic=True (torch.export "
                    "specializes sizes 0 and 1)")

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
            "config": {k: _as_json(v) for k, v in vars(ctx.config).items()},
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
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = DEFAULT_COMPONENT, *,
                    trust_remote_code: bool = False) -> Any:
        """Reopen one saved component's program on its runtime; returns a runner (``run(args) -> list``).

        ``manifest["components"][component]`` is that component's section. The kernel has validated the manifest,
        checked that every file it names lies inside ``path`` and matches its SHA-256; the program file is still
        untrusted input: a format whose loading can run code (unpickling, native libraries) must be inspected
        first and refused unless ``trust_remote_code`` (``hfexport.load(path, trust_remote_code=True)``), which the
        kernel passes when this method takes the keyword.
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
