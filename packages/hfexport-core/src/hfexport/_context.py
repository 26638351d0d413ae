"""The state of one export and the options every backend takes: :class:`ExportContext` (what the pipeline's stages
and steps read and write), :class:`ExportConfig`, :class:`RuntimeNeeds`, and the model-safety helpers of the pipeline
(the per-model lock, training flags and buffers put back)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ._fx import FixReport, apply_fx_node_fixes, apply_fx_program_fixes
from ._patching import PatchReport, patch_context
from ._registry import Registration, workarounds_for
from ._stages import ProgressCallback, StageTracker

logger = logging.getLogger("hfexport")

if TYPE_CHECKING:
    import torch

__all__ = ["ExportConfig", "ExportContext", "InvalidInputError", "RuntimeNeeds"]


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
        description: the tracer's description of the lowered program for the manifest (inputs, outputs, output
            spec), made by the pipeline after ``lower``.
        tracker: runs the stages and steps (``with ctx.stage(3): ...``, ``with ctx.step("torch.onnx.export"): ...``):
            progress, timings, and the stage or step a failure names.
    """

    exporter: Any  # the backend's Exporter
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
    description: dict[str, Any] | None = None
    tracker: StageTracker = field(init=False)

    def __post_init__(self) -> None:
        self.tracker = StageTracker(self.exporter.name, self.model_class, self.progress, self.exporter.hints_for)

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

    def stage(self, number: int) -> contextlib.AbstractContextManager[None]:
        """Run the ``with`` body as the exporter's documented stage ``number``: reported, timed, and named by a
        failure (an :class:`ExportError` with the stage and the backend's hints)."""
        stages = self.exporter.stages
        return self.tracker.stage(stages[number - 1], len(stages))

    def capture_stage(self, number: int) -> contextlib.AbstractContextManager[None]:
        """Run the ``with`` body as the tracer's stage ``number`` (the capture's: ``dynamo`` stage 2, Model patches),
        shown under the backend's own stages unless the backend is the tracer's."""
        tracer = self.exporter.tracer
        owner = getattr(tracer, "name", "capture")
        return self.tracker.stage(tracer.stages[number - 1], len(tracer.stages), owner,
                                  depth=0 if owner == self.exporter.name else 1)

    def step(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Run a toolchain call (``"torch.onnx.export"``) as a named, timed step: of the current stage inside one,
        of the pipeline between stages. A failure inside it names the step in the :class:`ExportError`."""
        return self.tracker.step(name)

    def workarounds(self, kind: str, scopes: Iterable[str]) -> list[Registration]:
        """The registrations of ``kind`` for ``scopes``, minus those this export's config disables."""
        return workarounds_for(kind, scopes, self.config.disable)

    def install_patches(self, scopes: Sequence[str], until: contextlib.ExitStack | None = None) -> PatchReport:
        """Install the patches of ``scopes`` until the export ends, or until ``until`` closes (capture's patches that
        only the trace needs); factories with a ``ctx`` parameter get this context. Record what was installed or
        skipped."""
        stack = self.stack if until is None else until
        report = stack.enter_context(patch_context(tuple(scopes), self.config.disable, ctx=self))
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


@dataclass(frozen=True)

class RuntimeNeeds:
    """What a backend's runtime needs from capture, declared as data on its exporter class (:attr:`Exporter.needs`)
    and read once, before a task is planned. Nothing calls back into the backend.

    Attributes:
        cache_layout: where a generation program keeps its KV cache. ``"io"``: the cache crosses the program boundary
            as inputs and outputs (ONNX has no mutable state; a ``.pt2`` would store the buffers). ``"in_place"``: the
            runtime keeps the buffers a program mutates from one call to the next (ExecuTorch's mutable buffers,
            OpenVINO's variables), so the cache lives in the program's buffers and the batch is static.
            ``"growing"``: the cache crosses the program boundary as inputs (``[batch, kv_heads, past, head_dim]``, any
            ``past``) and outputs (``past + seq`` positions: the new ones concatenated), with ``attention_mask`` over
            ``past + seq`` positions and no ``past_length``; the runtime keeps the outputs as its own state between
            calls (OpenVINO's ``ReadValue``/``Assign`` variables, which its CPU plugin fuses with
            ``ScaledDotProductAttention`` into a cache it appends to in place). Text generation only; the other
            generative tasks take ``"in_place"`` then.
        attention: the op a generation program's cached attention is traced as, for the backend to lower. ``None``:
            plain ops over the cache's whole capacity. ``"hfexport::cache_attention"``: the cache write and the
            attention as one functional op (ONNX Runtime's ``GroupQueryAttention`` reads only the filled positions).
            ``"llama::custom_sdpa"``: ExecuTorch's LLM kernels ``llama::update_cache`` and ``llama::custom_sdpa``,
            which write the cache buffers in place (with ``cache_layout="in_place"``; capture imports them from executorch).
    """

    cache_layout: Literal["io", "in_place", "growing"] = "io"
    attention: str | None = None

    def __post_init__(self) -> None:
        if self.cache_layout not in ("io", "in_place", "growing"):
            raise ValueError(f"cache_layout must be 'io', 'in_place' or 'growing', got {self.cache_layout!r}")



_WARNED_DRIFT: set[str] = set()


def warn_version_drift(exporter_class: Any) -> list[str]:
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


