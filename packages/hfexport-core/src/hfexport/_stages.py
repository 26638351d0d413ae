"""The stage protocol: an exporter is an ordered, introspectable list of stages."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ExportError", "Stage", "StageEvent", "run_stages"]


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
    """A progress event: a stage started, finished or failed.

    ``depth`` is 0 for the backend's own stages and 1 for a nested pipeline (the dynamo trace inside an
    ONNX or ExecuTorch export). ``seconds`` is set on ``done`` and ``failed``.
    """

    backend: str
    stage: Stage
    total: int
    status: Literal["start", "done", "failed"]
    seconds: float = 0.0
    depth: int = 0


ProgressCallback = Callable[[StageEvent], None]


class ExportError(RuntimeError):
    """An export failed: names the backend, the stage (number and title) and the model class.

    The original exception is chained as ``__cause__``. ``hints`` are one or two concrete next steps.

    Attributes:
        backend: the backend name (``"onnx"``).
        stage_number: 1-based stage number, or 0 when the failure came before the first stage.
        stage_title: the stage title.
        model_class: the class name of the model being exported.
        hints: next steps shown to the user.
    """

    def __init__(self, backend: str, model_class: str, cause: BaseException, stage: Stage | None = None,
                 total: int = 0, hints: Sequence[str] = (), where: str = ""):
        self.backend = backend
        self.model_class = model_class
        self.stage_number = stage.number if stage else 0
        self.stage_title = stage.title if stage else ""
        self.hints = list(hints)
        where = stage.label(total) if stage else (where or "before the first stage")
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        message = f"{backend} export: {where} failed for {model_class}: {type(cause).__name__}: {first_line}"
        if self.hints:
            message += "\nNext steps:\n" + "\n".join(f"  - {h}" for h in self.hints)
        super().__init__(message)


def _default_hints(stage: Stage, cause: BaseException) -> list[str]:
    text = f"{type(cause).__name__}: {cause}"
    hints = []
    if "data-dependent" in text.lower() or "guard" in text.lower():
        hints.append("a Python branch on a tensor value blocks tracing: try dynamic=False, or register a "
                     "patch that makes the branch tensor-only (see README: 'Adding a patch')")
    if "Constraints violated" in text or "specialized" in text:
        hints.append("a dimension you marked dynamic was specialized to a constant: drop it from "
                     "dynamic_shapes, or use Dim.AUTO (dynamic=True) and let torch.export decide")
    hints.append(f"see the full traceback above (the original {type(cause).__name__} is chained); "
                 f"the stage's extension point is {stage.extension_point}")
    return hints


def run_stages(backend: str, stages: Sequence[Stage], target: Any, ctx: Any, model_class: str,
               progress: ProgressCallback | None = None, depth: int = 0) -> dict[str, float]:
    """Run ``stages`` in order, calling ``getattr(target, stage.method)(ctx)`` for each.

    Args:
        backend: backend name, used in events and errors.
        stages: the stages, numbered 1..N.
        target: the object whose methods implement the stages (the exporter).
        ctx: the state passed to every stage.
        model_class: the model's class name, for errors.
        progress: called with a :class:`StageEvent` at the start and end of each stage.
        depth: nesting depth for progress display.

    Returns:
        Seconds per stage title, in order.

    Raises:
        ExportError: the first failing stage, with the original exception chained. An ExportError raised
            by a nested pipeline passes through unchanged (it already names its own stage).
    """
    total = len(stages)
    timings: dict[str, float] = {}
    for stage in stages:
        if progress:
            progress(StageEvent(backend, stage, total, "start", depth=depth))
        start = time.perf_counter()
        try:
            getattr(target, stage.method)(ctx)
        except ExportError:
            if progress:
                progress(StageEvent(backend, stage, total, "failed", time.perf_counter() - start, depth))
            raise
        except Exception as exc:
            seconds = time.perf_counter() - start
            if progress:
                progress(StageEvent(backend, stage, total, "failed", seconds, depth))
            hints = list(getattr(target, "hints_for", lambda s, e: [])(stage, exc)) or _default_hints(stage, exc)
            raise ExportError(backend, model_class, exc, stage, total, hints) from exc
        timings[f"{backend}.{stage.number}"] = round(time.perf_counter() - start, 4)
        if progress:
            progress(StageEvent(backend, stage, total, "done", time.perf_counter() - start, depth))
    return timings
