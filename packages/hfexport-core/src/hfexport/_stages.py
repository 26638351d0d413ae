"""The stage protocol: an exporter is an ordered, introspectable list of stages."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ExportError", "Stage", "StageEvent", "StagePath", "StepRecorder", "run_stages"]


@dataclass(frozen=True)
class Stage:
    """One step of an exporter's pipeline.

    Attributes:
        number: 1-based position; the exporter file marks it with ``# ── Stage N: Title ──``.
        title: short title, as in the docs (``"Model patches"``).
        extension_point: how a user extends this stage (``'@register_patch("dynamo", ...)'``), or
            ``"internal"``.
        method: name of the exporter method that runs the stage, called as ``method(ctx)``.
        runs: the toolchain call made inside this stage, if any (``"torch.export.export"``), so that an
            error says which call failed.
    """

    number: int
    title: str
    extension_point: str
    method: str
    runs: str = ""

    def label(self, total: int) -> str:
        runs = f" → {self.runs}" if self.runs else ""
        return f"stage {self.number}/{total} ({self.title}{runs})"


@dataclass(frozen=True)
class StageEvent:
    """A progress event: a stage (or a toolchain step inside it) started, finished or failed.

    ``depth`` is 0 for the backend's own stages and 1 for a nested pipeline (the dynamo trace inside an
    ONNX or ExecuTorch export). ``seconds`` is set on ``done`` and ``failed``. ``step`` names the toolchain
    call (``"torch.onnx.export"``) when the event is about a step rather than the stage itself.
    """

    backend: str
    stage: Stage
    total: int
    status: Literal["start", "done", "failed"]
    seconds: float = 0.0
    depth: int = 0
    step: str = ""


ProgressCallback = Callable[[StageEvent], None]


@dataclass(frozen=True)
class StagePath:
    """One level of where an export failed: ``backend`` stage ``number``/``total`` (``title``)."""

    backend: str
    number: int
    total: int
    title: str
    runs: str = ""

    def label(self, step: str = "") -> str:
        runs = f" → {step or self.runs}" if step or self.runs else ""
        return f"stage {self.number}/{self.total} ({self.title}{runs})"


# Exceptions that, raised by hfexport's own stage code (not inside a toolchain step), mean a bug of ours
# rather than a problem with the user's model or inputs.
_INTERNAL_ERRORS = (AssertionError, AttributeError, NameError, IndexError, ZeroDivisionError, RecursionError)


class ExportError(RuntimeError):
    """An export failed: names the backend, the stage path and the model class; the cause is chained.

    A failure inside a nested pipeline names the whole path, outer to inner:
    ``onnx export: stage 3/5 (FX node fixes) -> dynamo stage 5/5 (State cleanup) -> torch.export.export``.

    Attributes:
        backend: the backend the user called (``"onnx"``).
        stage_number: 1-based number of the outermost failing stage, or 0 before the first stage.
        stage_title: its title.
        path: every level, outer to inner (:class:`StagePath`), empty before the first stage.
        step: the toolchain call that raised (``"torch.export.export"``), or ``""`` when the stage's own
            code raised.
        internal: ``True`` when the failure looks like a bug of hfexport (an ``AttributeError``-like error
            raised by a stage's own code, or a failure after every stage passed); ``False`` for a problem
            with the model, its inputs or the toolchain.
        model_class: the class name of the model being exported.
        cause: the original exception (also ``__cause__``).
        hints: next steps shown to the user.
    """

    def __init__(self, backend: str, model_class: str, cause: BaseException, stage: Stage | None = None,
                 total: int = 0, hints: Sequence[str] = (), where: str = "", step: str = "",
                 internal: bool | None = None):
        self.backend = backend
        self.model_class = model_class
        self.cause = cause
        self.path = [StagePath(backend, stage.number, total, stage.title, stage.runs)] if stage else []
        self.step = step
        self.where = where
        self.internal = (isinstance(cause, _INTERNAL_ERRORS) and not step) if internal is None else internal
        self.hints = list(hints)
        if self.internal:
            self.hints.append("this looks like a bug in hfexport, not in your model: please report it with the "
                              "full traceback (CLI: --debug)")
        super().__init__(self._message())

    @property
    def stage_number(self) -> int:
        return self.path[0].number if self.path else 0

    @property
    def stage_title(self) -> str:
        return self.path[0].title if self.path else ""

    def _message(self) -> str:
        if self.path:
            # The innermost stage names the toolchain step that raised, if one did.
            labels = [p.label(self.step if i == len(self.path) - 1 else "") for i, p in enumerate(self.path)]
            where = " -> ".join([labels[0], *(f"{p.backend} {label}" for p, label in zip(self.path[1:], labels[1:],
                                                                                          strict=True))])
        else:
            where = self.where or "before the first stage"
        text = str(self.cause).strip()
        first_line = text.splitlines()[0] if text else ""
        message = (f"{self.backend} export: {where} failed for {self.model_class}: "
                   f"{type(self.cause).__name__}: {first_line}")
        if self.hints:
            message += "\nNext steps:\n" + "\n".join(f"  - {h}" for h in self.hints)
        return message

    def within(self, backend: str, stage: Stage, total: int) -> ExportError:
        """Prefix the path with the outer stage this (nested) failure happened in; returns ``self``."""
        self.path.insert(0, StagePath(backend, stage.number, total, stage.title, stage.runs))
        self.backend = backend
        self.args = (self._message(),)
        return self


def _default_hints(stage: Stage, cause: BaseException, step: str = "") -> list[str]:
    text = f"{type(cause).__name__}: {cause}"
    hints = []
    if "data-dependent" in text.lower() or "guard" in text.lower():
        hints.append("a Python branch on a tensor value blocks tracing: try dynamic=False, or register a "
                     "patch that makes the branch tensor-only (see README: 'Adding a patch')")
    if "Constraints violated" in text or "specialized" in text:
        hints.append("a dimension you marked dynamic was specialized to a constant: drop it from "
                     "dynamic_shapes, or use Dim.AUTO (dynamic=True) and let torch.export decide")
    if step:  # raised while the toolchain ran: by the model's own code, or by the toolchain on it
        hints.append(f"the {type(cause).__name__} was raised inside {step}, while it ran the model: the innermost "
                     "frames of the chained traceback show whether the model's forward or the toolchain raised it")
    else:
        hints.append(f"see the full traceback (the original {type(cause).__name__} is chained; CLI: --debug); "
                     f"the stage's extension point is {stage.extension_point}")
    return hints


class StepRecorder:
    """Runs toolchain calls as named steps inside a stage: timed, reported, and named by a failure.

    ``ExportContext`` holds one; stages write ``with ctx.step("torch.onnx.export"): ...``.
    """

    def __init__(self, progress: ProgressCallback | None = None):
        self.progress = progress
        self.timings: dict[str, float] = {}
        self.failed_step = ""
        self._current: tuple[str, Stage, int, int] | None = None  # backend, stage, total, depth

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        current = self._current
        event = (lambda status, seconds=0.0: self.progress(StageEvent(  # noqa: E731
            current[0], current[1], current[2], status, seconds, current[3] + 1, name))) \
            if self.progress and current else (lambda status, seconds=0.0: None)
        event("start")
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            self.failed_step = self.failed_step or name
            event("failed", time.perf_counter() - start)
            raise
        seconds = time.perf_counter() - start
        key = f"{current[0]}.{current[1].number}.{name}" if current else name
        self.timings[key] = round(self.timings.get(key, 0.0) + seconds, 4)
        event("done", seconds)


def run_stages(backend: str, stages: Sequence[Stage], target: Any, ctx: Any, model_class: str,
               progress: ProgressCallback | None = None, depth: int = 0) -> dict[str, float]:
    """Run ``stages`` in order, calling ``getattr(target, stage.method)(ctx)`` for each.

    Args:
        backend: backend name, used in events and errors.
        stages: the stages, numbered 1..N.
        target: the object whose methods implement the stages (the exporter).
        ctx: the state passed to every stage; when it has a ``steps`` :class:`StepRecorder`, the toolchain
            step that fails is named in the error.
        model_class: the model's class name, for errors.
        progress: called with a :class:`StageEvent` at the start and end of each stage.
        depth: nesting depth for progress display.

    Returns:
        Seconds per stage (``"<backend>.<number>"``), in order.

    Raises:
        ExportError: the first failing stage, with the original exception chained. An ExportError raised
            by a nested pipeline gets this stage prefixed to its path.
    """
    total = len(stages)
    timings: dict[str, float] = {}
    steps: StepRecorder | None = getattr(ctx, "steps", None)
    for stage in stages:
        if progress:
            progress(StageEvent(backend, stage, total, "start", depth=depth))
        start = time.perf_counter()
        outer = steps._current if steps else None
        if steps:
            steps._current, steps.failed_step = (backend, stage, total, depth), ""
        try:
            getattr(target, stage.method)(ctx)
        except ExportError as exc:
            if progress:
                progress(StageEvent(backend, stage, total, "failed", time.perf_counter() - start, depth))
            if exc.path and exc.path[0].backend == backend and exc.path[0].number == stage.number:
                raise  # already names this stage
            raise exc.within(backend, stage, total) from exc.__cause__
        except Exception as exc:
            seconds = time.perf_counter() - start
            if progress:
                progress(StageEvent(backend, stage, total, "failed", seconds, depth))
            step = steps.failed_step if steps else ""
            hints = list(getattr(target, "hints_for", lambda s, e: [])(stage, exc)) or _default_hints(stage, exc, step)
            raise ExportError(backend, model_class, exc, stage, total, hints, step=step) from exc
        finally:
            if steps:
                steps._current = outer
        timings[f"{backend}.{stage.number}"] = round(time.perf_counter() - start, 4)
        if progress:
            progress(StageEvent(backend, stage, total, "done", time.perf_counter() - start, depth))
    return timings
