"""The exporter base class (what a backend implements: ``prepare``, ``lower``, ``package``, ``load_runner``), the
tracer protocol, and the checks of an exporter's config, options, inputs and workaround scopes. The verification
of the packaged artifact against eager PyTorch is :func:`hfexport._pipeline.verify_export`."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ._artifact import DEFAULT_COMPONENT, SCHEMA_VERSION, Component, ExportedModel, versions_of
from ._context import (
    ExportConfig,
    ExportContext,
    InvalidInputError,
    RuntimeNeeds,
    _as_json,
    _Config,
    _config_as,
)
from ._patching import UnresolvedPatchWarning, is_user_registration
from ._registry import list_workarounds
from ._stages import ProgressCallback, Stage, Step, running_order

if TYPE_CHECKING:
    pass

__all__ = ["ExportConfig", "ExportContext", "Exporter", "InvalidInputError", "RuntimeNeeds", "Tracer"]


class Tracer(Protocol):
    """What a backend gets from the package that captures models (hfexport-dynamo's ``DYNAMO_TRACER``): the
    capture step of every export, and everything about the model that the kernel does not know.

    The kernel names no tracer: an exporter sets ``tracer``, and the kernel's pipeline calls :meth:`capture`
    between the exporter's :meth:`~Exporter.prepare` and :meth:`~Exporter.lower`. ``scopes`` are the workaround
    scopes capture installs (``("dynamo",)``); ``task_scopes`` those a planned task installs itself, around its
    own forward (``("dynamo.text_generation",)``); ``stages`` its documented stages (``ctx.capture_stage(n)``).
    """

    name: str
    scopes: tuple[str, ...]
    task_scopes: tuple[str, ...]
    stages: tuple[Stage, ...]

    def capture(self, ctx: ExportContext) -> Any:
        """Run the capture stages and ``torch.export.export`` on ``ctx.model``; set and return ``ctx.program``."""

    def task_options(self, task: str) -> type:
        """The dataclass of ``task``'s options (``max_cache_len``, ...); ``ValueError`` for a task it cannot plan."""

    def plan_task(self, model: Any, task: str, inputs: Mapping[str, Any] | None, options: Any,
                  needs: RuntimeNeeds) -> Any:
        """The :class:`~hfexport._tasks.TaskPlan` of ``task`` for a runtime with ``needs``."""

    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any] | None: ...

    def check_inputs(self, inputs: Mapping[str, Any], model: Any = None) -> None:
        """Raise ``InvalidInputError`` for inputs ``model`` cannot take (before any stage runs)."""

    def program_manifest(self, ctx: ExportContext, program: Any) -> dict[str, Any]: ...

    def extra_files(self, ctx: ExportContext) -> dict[str, Any]: ...

    def reference(self, ctx: ExportContext) -> Any: ...

    def second_shape_inputs(self, ctx: ExportContext, inputs: Mapping[str, Any], *,
                            smallest: bool = False) -> dict[str, Any] | None:
        """Inputs at a second shape for the export's verification (each dynamic size moved within its range; with
        ``smallest``, each at the least size of its range, below the example's); None when nothing moves."""

    def sample_inputs(self, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None: ...

    def generate(self, exported: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any: ...

    def artifact_class(self, manifest: dict[str, Any]) -> type:
        """Optional: the :class:`~hfexport.ExportedModel` subclass :func:`hfexport.load` makes for an artifact of
        ``manifest`` (hfexport-dynamo's for ``task="text-generation"``: one that transformers' ``pipeline`` takes);
        without it, ``ExportedModel``."""

    def load_model(self, path: str | Path) -> Any: ...

    def prepare_load(self, manifest: dict[str, Any], *, trust_remote_code: bool = False) -> None:
        """Before a saved artifact is opened: register the pytree types its output specs name that the
        tracer's allow-list admits (never an import by a name from the manifest, unless ``trust_remote_code``)."""


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
    """The scopes the imported exporters install (their own, their tracers' and their tracers' tasks')."""
    scopes: set[str] = set()
    for cls in _exporter_classes():
        scopes.update(getattr(cls.tracer, "scopes", ()), getattr(cls.tracer, "task_scopes", ()), cls.scopes)
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


class Exporter:
    """Base class of every backend's exporter: one export reads capture → lower → package.

    The kernel's pipeline (:func:`hfexport._pipeline.export_program`) calls, in this order, :meth:`prepare` (the
    backend's stages that act before the trace: patches, device and dtype), the tracer's ``capture`` (the dynamo
    stages, then ``torch.export.export``), :meth:`lower` (the backend's remaining stages and toolchain steps, top to
    bottom) and :meth:`package` (the artifact); then it verifies the artifact against eager PyTorch.

    A subclass declares ``name``, ``config_class``, ``stages`` (its documented :class:`Stage` s, run as
    ``with ctx.stage(n):``), ``steps`` (the toolchain calls between them, for ``hfexport stages``), ``scopes`` (the
    workaround scopes it activates), ``tracer`` and ``needs`` (what its runtime needs from capture, as data), and
    implements :meth:`lower`, :meth:`package` and :meth:`load_runner`.
    """

    name: ClassVar[str] = "base"
    config_class: ClassVar[type[ExportConfig]] = ExportConfig
    stages: ClassVar[tuple[Stage, ...]] = ()
    steps: ClassVar[tuple[Step, ...]] = ()
    scopes: ClassVar[tuple[str, ...]] = ()
    # Distributions whose versions go into the manifest.
    toolchain: ClassVar[tuple[str, ...]] = ("torch",)
    # Versions this backend was tested with; a different major.minor installed gets one warning per process
    # (silence it with HFEXPORT_IGNORE_VERSION_DRIFT=1).
    tested_versions: ClassVar[dict[str, str]] = {}
    tracer: ClassVar[Tracer | None] = None
    # The ``*_file`` keys of a component's section (dotted below it: ``"onnx.data_file"``) whose files load_runner
    # reads only through ``hfexport.trust.artifact_bytes``, which checks size and SHA-256 on the very bytes it hands
    # over: ``hfexport.load`` leaves their hashing to that read (each file read and hashed once, not twice)
    checked_on_read: ClassVar[tuple[str, ...]] = ()
    # The tolerances of the verification every export runs (|exported - eager| <= atol + rtol * |eager|,
    # elementwise; integers equal): 1e-4 / 1e-3 are the figures the conformance sweep and the field cases verify
    # the tiny-model zoo with on dynamo, ONNX Runtime and ExecuTorch XNNPACK, all float32. A backend that computes
    # in another precision sets its own (executorch-cuda: bfloat16).
    verify_atol: ClassVar[float] = 1e-4
    verify_rtol: ClassVar[float] = 1e-3
    # What the runtime needs from capture (the KV cache's layout, the attention op it lowers): see RuntimeNeeds.
    needs: ClassVar[RuntimeNeeds] = RuntimeNeeds()
    # Options this backend fixes (a variant's name: executorch-xnnpack's backend="xnnpack"): the default when not
    # given, and a ValueError when given otherwise, in the config or as an option.
    preset_options: ClassVar[Mapping[str, Any]] = {}
    # What an export costs, as measured (issue 44; hfexport._cost): the export process's peak RSS over the model's
    # weight bytes, per ``quantize`` recipe (None: float), and the artifact's bytes over the weight bytes (default
    # 1.0). A backend with no figure gets no memory estimate; a recipe without one, the backend's highest figure.
    export_peak_ratio: ClassVar[Mapping[str | None, float]] = {}
    artifact_ratio: ClassVar[Mapping[str | None, float]] = {}

    def __init__(self, config: ExportConfig | None = None, **options: Any):
        """Raises:
            TypeError: ``config`` is the config of another backend (the message names both), an option this
                backend does not take, or an option of the wrong type.
        """
        _check_config_class(type(self), config)
        for key, preset in self.preset_options.items():
            given = options.get(key, getattr(config, key, preset))
            if given != preset:
                raise ValueError(f"backend {self.name!r} exports {key}={preset!r}, but {key}={given!r} was given: "
                                 f"leave {key} out, or use the backend for {key}={given!r}")
            if config is None:
                options.setdefault(key, preset)
        self.config = self.config_class.from_options(config, **options)

    def with_config(self, config: ExportConfig) -> Exporter:
        """This exporter with another config of its own class (a task's component: its planned dynamic shapes)."""
        exporter = copy.copy(self)
        exporter.config = config
        return exporter

    def config_as(self, kind: type[_Config]) -> _Config:
        """:attr:`config`, checked to be a ``kind`` (the backend's config class) and typed as one.

        Raises:
            TypeError: this exporter's config is not a ``kind``.
        """
        return _config_as(self.config, kind, f"this {type(self).__name__}'s")

    def new_state(self, ctx: ExportContext) -> Any:
        """The typed state the stages of one export hand on (a dataclass of the backend's own), kept in
        ``ctx.state``; None by default (a backend whose stages hand on nothing but ``ctx.program``)."""
        return None

    def active_scopes(self) -> tuple[str, ...]:
        """The workaround scopes an export of this backend may install: its own and its tracer's."""
        return tuple(dict.fromkeys((*getattr(self.tracer, "scopes", ()), *self.scopes)))

    def check_disable(self) -> None:
        """Raise ``ValueError`` when ``config.disable`` names no workaround of this backend's scopes.

        Every kind counts (patches, fixes, translations, variants); a scope covers its sub-scopes
        (``"executorch"`` covers ``"executorch.cuda"``). The message lists close matches.
        """
        warn_unresolved_scopes()
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

    # ── the pipeline's steps, for subclasses ─────────────────────────────────────────────────────────────
    def prepare(self, ctx: ExportContext) -> None:
        """The backend's stages that act before capture (patches the trace needs, the model's device and dtype);
        none by default."""

    def lower(self, ctx: ExportContext) -> None:
        """The backend's stages and toolchain steps after capture, top to bottom (``ctx.program`` is the captured
        ``ExportedProgram``); none by default (the ``.pt2`` is the captured program)."""

    # ── public ────────────────────────────────────────────────────────────────────────────────────────
    @classmethod
    def describe_stages(cls) -> list[dict[str, Any]]:
        """The documented stages (number, title, extension point) and, in running order between them, the steps
        (name, the toolchain call each runs)."""
        return [{"number": s.number, "title": s.title, "extension_point": s.extension_point}
                if isinstance(s, Stage) else {"step": s.name, "runs": s.runs}
                for s in running_order(cls.stages, cls.steps)]

    def export(self, model: Any, inputs: Mapping[str, Any] | None = None, *,
               progress: ProgressCallback | None = None, task: str | None = None, task_options: Any = None,
               verify: bool = True, atol: float | None = None, rtol: float | None = None,
               check_resources: bool = True) -> ExportedModel:
        """Capture, lower and package ``model``, and verify the artifact (see :func:`hfexport._pipeline.export`).

        ``task`` and ``task_options`` (the tracer's dataclass for the task) export the programs the task runs.
        """
        from ._pipeline import export

        return export(self, model, inputs, progress=progress, task=task, task_options=task_options, verify=verify,
                      atol=atol, rtol=rtol, check_resources=check_resources)

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
            if program is ctx.program and ctx.description is not None:  # what the pipeline had the tracer describe
                described = ctx.description
            else:
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
            **({"source_dtype": ctx.report["source_dtype"]} if ctx.report.get("source_dtype") else {}),
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
