"""One export, top to bottom: capture → lower → package, then verify; a task's components in one loop.

``hfexport.export(model, backend=..., task=...)`` comes here with the backend's exporter:

1. the tracer plans the task (``tracer.plan_task``: the modules, example inputs and dynamic shapes of each
   component, for a runtime with the exporter's :class:`~hfexport._context.RuntimeNeeds`), or the model is the one
   component;
2. for each component, :func:`export_program`: ``exporter.prepare`` (the backend's stages before the trace),
   ``tracer.capture`` (the dynamo stages, then ``torch.export.export``), ``exporter.lower`` (the backend's stages and
   toolchain steps), ``exporter.package`` (the artifact), then the verification against eager PyTorch
   (:func:`hfexport._verification.verify_export`);
3. a task's components are merged into one artifact (:func:`hfexport._tasks.merge_components`).

Nothing below calls back into this module: data flows down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from ._artifact import ExportedModel, VerificationError
from ._context import ExportContext, InvalidInputError, _model_lock, _snapshot_modes, warn_version_drift
from ._stages import ExportError, ProgressCallback
from ._tasks import ComponentPlan, TaskPlan, merge_components
from ._verification import check_verify_options, verify_export

__all__ = ["export", "export_program"]


def export(exporter: Any, model: Any, inputs: Mapping[str, Any] | None = None, *,
           progress: ProgressCallback | None = None, task: str | None = None, task_options: Any = None,
           verify: bool = True, atol: float | None = None, rtol: float | None = None) -> ExportedModel:
    """Export ``model`` with ``exporter``: one program, or with ``task`` the programs the task runs.

    Args:
        task_options: the tracer's options dataclass for ``task`` (``tracer.task_options(task)(...)``); default
            its defaults.
        verify, atol, rtol: as for :func:`hfexport.export`.

    Raises:
        InvalidInputError: ``model`` is not an ``nn.Module`` or ``inputs`` is not a mapping of tensors and caches.
        TypeError: ``verify`` is not a bool, ``atol``/``rtol`` not a non-negative number, ``task_options``
            without a ``task``, or a ``task`` with ``dynamic``/``dynamic_shapes`` (the plan makes its own).
        ValueError: ``disable`` names a workaround this backend does not have; the tracer plans no such task.
        ExportError: a stage or step failed (names it; the cause is chained).
        VerificationError: with ``verify``, the outputs differ beyond the tolerances (names the component).
    """
    import torch

    atol, rtol = check_verify_options(exporter, verify, atol, rtol)
    if not isinstance(model, torch.nn.Module):
        raise InvalidInputError(f"model must be a torch.nn.Module, got {type(model).__name__}; "
                                "load it first, e.g. AutoModel.from_pretrained(path)")
    if task is None:
        if task_options is not None:
            raise TypeError("task_options are the options of a task export: pass task=...")
        with _model_lock(model):  # a second export of this instance in another thread waits for this one
            return export_program(exporter, model, inputs, progress=progress, verify=verify, atol=atol, rtol=rtol)

    tracer = exporter.tracer
    if tracer is None or not hasattr(tracer, "plan_task"):
        raise ValueError(f"backend {exporter.name!r} exports single programs only (its tracer plans no tasks); "
                         f"export without task={task!r}")
    if exporter.config.dynamic or exporter.config.dynamic_shapes:  # the plan's dims would replace the user's
        raise TypeError(f"task={task!r} plans the dynamic dims of each program itself (batch up to max_batch, "
                        "sequence up to prefill_chunk): export without dynamic=/dynamic_shapes=")
    if task_options is None:
        task_options = tracer.task_options(task)()
    start = time.perf_counter()
    with _model_lock(model):
        plan: TaskPlan = tracer.plan_task(model, task, inputs, task_options, exporter.needs)
        exported: list[tuple[ComponentPlan, ExportedModel]] = []
        for part in plan.components:  # the task loop: each component captured, lowered, packaged, verified
            config = dataclasses.replace(exporter.config, dynamic=False, dynamic_shapes=part.dynamic_shapes)
            try:
                exported.append((part, export_program(exporter.with_config(config), part.module, part.inputs,
                                                      progress=progress, verify=verify, atol=atol, rtol=rtol)))
            except VerificationError as exc:  # name the model and the component, not the task's wrapper module
                raise VerificationError(exc.backend, f"{type(model).__name__} ({part.name} program)", exc.report,
                                        exc.exported, part.name) from None
            except ExportError as exc:  # the user's model, not the task's wrapper (CausalLMStep)
                exc.model_class = f"{type(model).__name__} ({part.name} program)"
                exc.args = (exc._message(),)
                raise
    return merge_components(exporter, plan, exported, model, time.perf_counter() - start)


def export_program(exporter: Any, model: Any, inputs: Mapping[str, Any] | None, *,
                   progress: ProgressCallback | None, verify: bool, atol: float, rtol: float) -> ExportedModel:
    """One program: prepare → capture → lower → package, then the verification against eager PyTorch.

    The model is restored exactly afterwards (training flags, patched functions, nulled attributes), also on error.
    """
    exporter.check_disable()  # and warns about registered workarounds no backend installs
    model_class = type(model).__name__
    try:
        inputs = exporter.prepare_inputs(model, inputs)
    except InvalidInputError:
        raise
    except Exception as exc:
        raise ExportError(exporter.name, model_class, exc, where="building inputs from the config",
                          hints=["pass inputs explicitly: a mapping of forward keyword arguments"]) from exc
    exporter.check_inputs(inputs, model)
    warn_version_drift(type(exporter))
    modes = _snapshot_modes(model)
    start = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:  # patches and contexts the stages enter, closed before verifying
            ctx = ExportContext(exporter, model, inputs, exporter.config, stack, progress)
            ctx.state = exporter.new_state(ctx)
            model.eval()
            try:
                exporter.prepare(ctx)
                exporter.tracer.capture(ctx)  # sets ctx.program
                exporter.lower(ctx)
                ctx.description = exporter.tracer.program_manifest(ctx, ctx.program)  # for the manifest
            except ExportError:
                raise
            except Exception as exc:  # raised by a step (named) or by the pipeline's code between the stages
                raise ctx.tracker.error(exc, where="the code between its stages (prepare, capture, lower)") from exc
        ctx.report["timings"].update(ctx.tracker.timings)
        ctx.report["timings"]["total"] = round(time.perf_counter() - start, 4)
        try:
            exported = exporter.package(ctx)
        except Exception as exc:
            raise ExportError(exporter.name, model_class, exc, where="packaging (after the last stage)",
                              internal=True) from exc
        # In eval mode still, with every patch reverted and the model back on its device and dtype.
        verify_export(exporter, exported, ctx, inputs, atol=atol, rtol=rtol, raise_on_mismatch=verify)
        return exported
    finally:
        for module, training in modes:
            module.training = training
