"""The stage protocol: an exporter is an ordered, introspectable list of stages."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ExportError", "Stage", "StageEvent", "StagePath", "StageTracker", "Step", "running_order"]


@dataclass(frozen=True)
class Stage:
    """One documented stage of an exporter: where a user extends the export (the stage reference: docs/guide.md, Architecture).

    A stage applies its extension point and nothing else; the toolchain calls between stages are :class:`Step` s.

    Attributes:
        number: 1-based position; the exporter file marks it with ``# ── Stage N: Title ──``.
        title: short title, as in the docs (``"Model patches"``).
        extension_point: how a user extends this stage (``'@register_patch("dynamo", ...)'``), or ``"internal"``.
    """

    number: int
    title: str
    extension_point: str

    def label(self, total: int) -> str:
        return f"stage {self.number}/{total} ({self.title})"


@dataclass(frozen=True)
class Step:
    """A named step of an exporter's pipeline between its documented stages: the toolchain call it runs.

    Attributes:
        after: the number of the stage it follows (0: before the first stage).
        name: what the step does, in one word or two (``"convert"``, ``"capture"``).
        runs: the toolchain call (``"torch.onnx.export"``); the same string the code times with ``ctx.step``.
    """

    after: int
    name: str
    runs: str


def running_order(stages: Sequence[Stage], steps: Sequence[Step]) -> list[Stage | Step]:
    """``stages`` with each of ``steps`` after the stage it follows, in the order an export runs them."""
    out: list[Stage | Step] = [s for s in steps if s.after == 0]
    for stage in stages:
        out.append(stage)
        out.extend(s for s in steps if s.after == stage.number)
    return out


@dataclass(frozen=True)
class StageEvent:
    """A progress event: a stage, or a step (a toolchain call), started, finished or failed.

    ``backend`` is the pipeline the stage belongs to (``"dynamo"`` for the capture's stages inside an ONNX export);
    ``depth`` is 0 for the exporter's own stages and steps, 1 for the capture's stages under another backend, and one
    more for a step inside a stage. ``stage`` is None for a step between stages; ``step`` names the toolchain call
    (``"torch.onnx.export"``) when the event is about a step. ``seconds`` is set on ``done`` and ``failed``.
    """

    backend: str
    stage: Stage | None
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

    def label(self, step: str = "") -> str:
        return f"stage {self.number}/{self.total} ({self.title}{f' → {step}' if step else ''})"


# Exceptions that, raised by hfexport's own stage code (not inside a toolchain step), mean a bug of ours
# rather than a problem with the user's model or inputs.
_INTERNAL_ERRORS = (AssertionError, AttributeError, NameError, IndexError, ZeroDivisionError, RecursionError)


class ExportError(RuntimeError):
    """An export failed: names the backend, where (a stage of its own, a capture stage, a step) and the model class.

    ``onnx export: dynamo stage 4/5 (Dynamic shapes) failed for LlamaForCausalLM: KeyError: ...``;
    ``onnx export: step torch.onnx.export failed for ...``. The cause is chained.

    Attributes:
        backend: the backend the user called (``"onnx"``).
        stage_number: 1-based number of the failing stage, or 0 outside any stage.
        stage_title: its title.
        path: the failing stage (:class:`StagePath`; its ``backend`` is ``"dynamo"`` for a capture stage), empty
            for a failure outside any stage.
        step: the toolchain call that raised (``"torch.export.export"``), or ``""`` when hfexport's own code raised.
        internal: ``True`` when the failure looks like a bug of hfexport (an ``AttributeError``-like error
            raised by a stage's own code, or a failure after every stage passed); ``False`` for a problem
            with the model, its inputs or the toolchain.
        model_class: the class name of the model being exported.
        cause: the original exception (also ``__cause__``).
        hints: next steps shown to the user.
    """

    def __init__(self, backend: str, model_class: str, cause: BaseException, stage: Stage | None = None,
                 total: int = 0, hints: Sequence[str] = (), where: str = "", step: str = "",
                 internal: bool | None = None, owner: str | None = None):
        self.backend = backend
        self.model_class = model_class
        self.cause = cause
        self.path = [StagePath(owner or backend, stage.number, total, stage.title)] if stage else []
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
            owner = self.path[0].backend
            where = (f"{owner} " if owner != self.backend else "") + self.path[0].label(self.step)
        elif self.step:
            where = f"step {self.step}"
        else:
            where = self.where or "before the first stage"
        text = str(self.cause).strip()
        first_line = text.splitlines()[0] if text else ""
        message = (f"{self.backend} export: {where} failed for {self.model_class}: "
                   f"{type(self.cause).__name__}: {first_line}")
        if self.hints:
            message += "\nNext steps:\n" + "\n".join(f"  - {h}" for h in self.hints)
        return message


def _default_hints(stage: Stage | None, cause: BaseException, step: str = "") -> list[str]:
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
        where = f"; the stage's extension point is {stage.extension_point}" if stage else ""
        hints.append(f"see the full traceback (the original {type(cause).__name__} is chained; CLI: --debug){where}")
    return hints


class StageTracker:
    """Runs one export's stages and steps as ``with`` blocks: reported to ``progress``, timed, and named by a failure.

    :class:`~hfexport.plugin.ExportContext` holds one; a pipeline writes ``with ctx.stage(3): ...`` and
    ``with ctx.step("torch.onnx.export"): ...`` in the order it runs them. A ``with`` block, not a callback: the
    stage's code stays in the pipeline that reads top to bottom.

    A stage turns what its body raises into an :class:`ExportError` that names it. A step re-raises what its body
    raised as it is (so that the code around it may fall back) and remembers which exception left which step:
    :meth:`error` then names the step.
    """

    def __init__(self, backend: str, model_class: str, progress: ProgressCallback | None = None,
                 hints: Callable[[Stage | None, BaseException], list[str]] | None = None):
        self.backend = backend
        self.model_class = model_class
        self.progress = progress
        self.hints = hints or (lambda stage, exc: [])
        self.timings: dict[str, float] = {}
        self._stage: tuple[str, Stage, int, int] | None = None  # owner, stage, total, depth
        self._failed: tuple[str, BaseException] | None = None  # the last step that raised, and what it raised

    def _event(self, owner: str, stage: Stage | None, total: int, status: Any, seconds: float = 0.0,
               depth: int = 0, step: str = "") -> None:
        if self.progress:
            self.progress(StageEvent(owner, stage, total, status, seconds, depth, step))

    def failed_step(self, exc: BaseException) -> str:
        """The step ``exc`` left (``"torch.onnx.export"``), or ``""`` when no step raised it."""
        return self._failed[0] if self._failed is not None and self._failed[1] is exc else ""

    def error(self, exc: Exception, stage: Stage | None = None, total: int = 0, owner: str | None = None,
              where: str = "") -> ExportError:
        """The :class:`ExportError` for ``exc`` raised in ``stage`` (or between stages): names the step it left."""
        step = self.failed_step(exc)
        hints = list(self.hints(stage, exc)) or _default_hints(stage, exc, step)
        return ExportError(self.backend, self.model_class, exc, stage, total, hints, where=where, step=step,
                           owner=owner)

    @contextlib.contextmanager
    def stage(self, stage: Stage, total: int, owner: str | None = None, depth: int = 0) -> Iterator[None]:
        """Run the ``with`` body as ``stage`` (of ``total``, of pipeline ``owner``: default this backend's)."""
        owner = owner or self.backend
        self._event(owner, stage, total, "start", depth=depth)
        start, outer = time.perf_counter(), self._stage
        self._stage = (owner, stage, total, depth)
        try:
            yield
        except ExportError:
            self._event(owner, stage, total, "failed", time.perf_counter() - start, depth)
            raise
        except Exception as exc:
            self._event(owner, stage, total, "failed", time.perf_counter() - start, depth)
            raise self.error(exc, stage, total, owner) from exc
        finally:
            self._stage = outer
        seconds = time.perf_counter() - start
        self.timings[f"{owner}.{stage.number}"] = round(seconds, 4)
        self._event(owner, stage, total, "done", seconds, depth)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Run the ``with`` body as the toolchain call ``name``; inside a stage, a step of that stage."""
        owner, stage, total, depth = self._stage if self._stage else (self.backend, None, 0, -1)
        self._event(owner, stage, total, "start", depth=depth + 1, step=name)
        start = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            if self._failed is None or self._failed[1] is not exc:  # the innermost step that raised it
                self._failed = (name, exc)
            self._event(owner, stage, total, "failed", time.perf_counter() - start, depth + 1, name)
            raise
        seconds = time.perf_counter() - start
        key = f"{owner}.{stage.number}.{name}" if stage else f"{owner}.{name}"
        self.timings[key] = round(self.timings.get(key, 0.0) + seconds, 4)
        self._event(owner, stage, total, "done", seconds, depth + 1, name)
