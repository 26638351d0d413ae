"""One export, top to bottom: capture → lower → package, then verify; a task's components in one loop.

``hfexport.export(model, backend=..., task=...)`` comes here with the backend's exporter:

1. the tracer plans the task (``tracer.plan_task``: the modules, example inputs and dynamic shapes of each
   component, for a runtime with the exporter's :class:`~hfexport._context.RuntimeNeeds`), or the model is the one
   component;
2. for each component, :func:`export_program`: ``exporter.prepare`` (the backend's stages before the trace),
   ``tracer.capture`` (the dynamo stages, then ``torch.export.export``), ``exporter.lower`` (the backend's stages and
   toolchain steps), ``exporter.package`` (the artifact), then the verification against eager PyTorch
   (:func:`verify_export`, below);
3. a task's components are merged into one artifact (:func:`hfexport._tasks.merge_components`).

The verification every export ends with (:func:`verify_export`): the packaged artifact on its runtime against the
model in eager PyTorch, at the traced shape, at a second shape (each dynamic size moved by one) and at the smallest
shape of the ranges the manifest claims, recorded in the manifest's ``verification``; on a mismatch, the backend's
diagnosis (:meth:`~hfexport._exporter.Exporter.diagnose_mismatch`).

Nothing below calls back into this module: data flows down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from ._artifact import ExportedModel, VerificationError
from ._context import (
    ExportContext,
    InvalidInputError,
    _model_lock,
    _restore_buffers,
    _save_buffers,
    _snapshot_modes,
    warn_version_drift,
)
from ._cost import check_export_cost
from ._stages import ExportError, ProgressCallback
from ._tasks import ComponentPlan, TaskPlan, merge_components

__all__ = ["check_verify_options", "export", "export_program", "verify_export"]

logger = logging.getLogger("hfexport")


def export(exporter: Any, model: Any, inputs: Mapping[str, Any] | None = None, *,
           progress: ProgressCallback | None = None, task: str | None = None, task_options: Any = None,
           verify: bool = True, atol: float | None = None, rtol: float | None = None,
           check_resources: bool = True) -> ExportedModel:
    """Export ``model`` with ``exporter``: one program, or with ``task`` the programs the task runs.

    Args:
        task_options: the tracer's options dataclass for ``task`` (``tracer.task_options(task)(...)``); default
            its defaults.
        verify, atol, rtol, check_resources: as for :func:`hfexport.export`.

    Raises:
        InvalidInputError: ``model`` is not an ``nn.Module`` or ``inputs`` is not a mapping of tensors and caches.
        TypeError: ``verify`` is not a bool, ``atol``/``rtol`` not a non-negative number, ``task_options``
            without a ``task``, or a ``task`` with ``dynamic``/``dynamic_shapes`` (the plan makes its own).
        ValueError: ``disable`` names a workaround this backend does not have; the tracer plans no such task.
        InsufficientResourcesError: with ``check_resources``, the export would not fit this machine (before any trace).
        ExportError: a stage or step failed (names it; the cause is chained).
        VerificationError: with ``verify``, the outputs differ beyond the tolerances (names the component).
    """
    import torch

    atol, rtol = check_verify_options(exporter, verify, atol, rtol, weights_dtype(model))
    if not isinstance(model, torch.nn.Module):
        raise InvalidInputError(f"model must be a torch.nn.Module, got {type(model).__name__}; "
                                "load it first, e.g. AutoModel.from_pretrained(path)")
    if check_resources:  # once, before any trace: the estimated peak and artifact against this machine (issue 44)
        check_export_cost(exporter, model)
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


def weights_dtype(model: Any) -> str | None:
    """The floating dtype of most of ``model``'s parameter elements (``"bfloat16"`` for a model loaded in bf16),
    as the manifest's ``source_dtype`` records it; None for a model without floating parameters."""
    import torch

    counts: dict[Any, int] = {}
    for parameter in model.parameters() if isinstance(model, torch.nn.Module) else ():
        if parameter.is_floating_point():
            counts[parameter.dtype] = counts.get(parameter.dtype, 0) + parameter.numel()
    return str(max(counts, key=counts.__getitem__)).removeprefix("torch.") if counts else None


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
            ctx.report["source_dtype"] = weights_dtype(model)  # before a backend's prepare casts the model
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


# ── the verification against eager PyTorch ───────────────────────────────────────────────────────────────────
# The default tolerances (atol and rtol) of a model whose weights are half precision: eager computes in that dtype
# and a runtime rounds differently (or computes in float32: ONNX Runtime's CPU, XNNPACK, OpenVINO's CPU); a bf16
# tiny Llama's logits differ by 1e-3 on every backend, its greedy ids not at all. The CLI's --dtype uses the same.
HALF_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}


def check_verify_options(exporter: Any, verify: Any, atol: Any, rtol: Any,
                         dtype: str | None = None) -> tuple[float, float]:
    """The verification's tolerances (the backend's defaults where ``None``; for a model whose weights are
    ``dtype`` bfloat16 or float16, at least :data:`HALF_TOLERANCE`'s); refuses options of the wrong type."""
    if not isinstance(verify, bool):  # "no" is truthy
        raise TypeError(f"verify must be True or False, got {verify!r} ({type(verify).__name__})")
    out = []
    for name, value, default in (("atol", atol, exporter.verify_atol), ("rtol", rtol, exporter.verify_rtol)):
        if value is None:
            value = max(default, HALF_TOLERANCE.get(dtype or "", 0.0))
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise TypeError(f"{name} must be a non-negative number (the verification's tolerance), got "
                            f"{value!r} ({type(value).__name__})")
        out.append(float(value))
    return out[0], out[1]


def verify_export(exporter: Any, exported: ExportedModel, ctx: ExportContext, inputs: Mapping[str, Any], *,
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
            raise ExportError(exporter.name, ctx.model_class, exc, where="verification (running the artifact and "
                              "the eager model on the traced inputs)", hints=[
                                  "export with verify=False to get the artifact without this check, and call "
                                  "it to see the error", "see the full traceback (the error is chained)"]
                              ) from exc
        failed = {"backend": exporter.name, "passed": False, "atol": atol, "rtol": rtol,
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

            warnings.warn(f"the {exporter.name} runner has no reset(): its program mutates buffers, so the "
                          "verification run advanced the artifact's state by one call", stacklevel=4)
        exported.manifest.setdefault("timings_s", {})["verification"] = round(time.perf_counter() - start, 4)
    if not report.passed and raise_on_mismatch:  # verify=False stays one run of each: no diagnosis
        _diagnose(exporter, ctx, exported, checked, report)
        raise VerificationError(exporter.name, ctx.model_class, report, exported, component.name)
    if report.passed:
        _verify_second_shape(exporter, ctx, exported, checked, atol=atol, rtol=rtol,
                             raise_on_mismatch=raise_on_mismatch)


def _verify_second_shape(exporter: Any, ctx: ExportContext, exported: ExportedModel, inputs: Mapping[str, Any],
                         *, atol: float, rtol: float, raise_on_mismatch: bool) -> None:
    """Run the artifact and the model once more at the tracer's second shape (each dynamic size moved by one
    within its range, so that its parity differs: :meth:`Tracer.second_shape_inputs`), which catches a
    program that a guard on the sizes specialized to the traced ones, and once at the smallest shape (each
    dynamic size at the least of its range, 1 for a count of images: a count that a ``list()`` or ``unbind``
    fixed at trace time); recorded as ``verification.second_shape`` and ``verification.smallest_shape`` in
    the manifest, each ``{"passed": None, "skipped": why}`` where a program with dynamic dims cannot be
    checked so.

    Raises:
        VerificationError: the outputs differ at either shape (with ``raise_on_mismatch``).
        ExportError: the artifact or the model raised at either shape (with ``raise_on_mismatch``).
    """
    make = getattr(exporter.tracer, "second_shape_inputs", None)
    if not callable(make):
        return
    component = exported.default_component
    dynamic = any(entry.get("dynamic_dims") for entry in exported._section(component).get("inputs", ())
                  if isinstance(entry, dict))
    # both calls as the Tracer protocol gives them: a TypeError is the tracer's (or the model's), never swallowed
    second, smallest = make(ctx, inputs), make(ctx, inputs, smallest=True)
    checks = [("second_shape", second, "no dynamic size can move by one within its range (each range a "
               "single size, or inputs the program sees otherwise)"),
              ("smallest_shape", smallest, "every dynamic size of the example is already the least of its "
               "range (or the inputs cannot be resized)")]
    from ._artifact import _shapes

    done: dict[str, tuple[Any, dict[str, Any]]] = {}  # key -> (its shapes, its record)
    for key, alternate, why_not in checks:
        if not alternate:
            if dynamic:
                _record_shape_check(exported, component, key, {"passed": None, "skipped": why_not})
            continue
        shapes = _shapes(alternate)
        same = next((record for seen, record in done.values() if seen == shapes), None)
        if same is not None:  # the two moves met (a range [1, 2] traced at 2): checked once
            _record_shape_check(exported, component, key, same)
            continue
        done[key] = shapes, _check_at_shape(exporter, ctx, exported, component, key, alternate, atol=atol,
                                            rtol=rtol, raise_on_mismatch=raise_on_mismatch)


def _record_shape_check(exported: ExportedModel, component: Any, key: str, record: dict[str, Any]) -> None:
    for section in (exported.manifest.get("verification"), exported._section(component).get("verification")):
        if isinstance(section, dict):
            section[key] = record


def _check_at_shape(exporter: Any, ctx: ExportContext, exported: ExportedModel, component: Any, key: str,
                    alternate: Mapping[str, Any], *, atol: float, rtol: float,
                    raise_on_mismatch: bool) -> dict[str, Any]:
    """One run of the artifact and of the model at ``alternate`` (:func:`_verify_second_shape`), recorded as
    ``verification.<key>``."""
    from ._artifact import VerificationError

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
    _record_shape_check(exported, component, key, record)
    if not raise_on_mismatch or record["passed"] is not False:
        return record
    if key == "smallest_shape":
        why = ("the traced shape matched eager, the smallest shape of the ranges the manifest claims (each "
               "dynamic size at its least, 1 for a count) does not: the program fixed a size at the traced one "
               "(a list() or unbind over images, a branch on a size)")
        where = "verification at the smallest shape"
        if error is not None and "Guard failed" in str(error):  # the program's own input guard, not a crash
            why = ("the program's guard refuses the least sizes of the ranges the manifest would claim (torch."
                   "export kept a condition on them, such as a size of 1 it specializes): start the Dim ranges "
                   "above the sizes the guard names")
    else:
        why = ("the traced shape matched eager, this one (every dynamic size moved by one, within its range) "
               "does not: a guard on the sizes specialized the program to the traced ones (their parity, a "
               "multiple)")
        where = "verification at a second shape"
    if error is not None:
        raise ExportError(exporter.name, ctx.model_class, error, where=f"{where} "
                          f"({', '.join(f'{k}={v}' for k, v in record['inputs'].items())})",
                          hints=[why, "export with verify=False to keep the artifact, or give these dims "
                                 "static sizes or explicit Dim ranges"], internal=False) from error
    report.diagnosis = {"summary": why}
    raise VerificationError(exporter.name, ctx.model_class, report, exported, component.name)


def _diagnose(exporter: Any, ctx: ExportContext, exported: ExportedModel, inputs: Mapping[str, Any],
              report: Any) -> None:
    """Ask :meth:`diagnose_mismatch` where the failing export goes wrong; record its answer in the report and
    in the manifest (``verification.diagnosis``). A diagnosis that fails is logged, never raised."""
    start = time.perf_counter()
    try:
        diagnosis = exporter.diagnose_mismatch(ctx, exported, inputs, report)
    except Exception as exc:  # the verification's own answer stands; say why there is no diagnosis
        logger.warning("%s: the diagnosis of the failed verification failed: %s: %s", exporter.name,
                       type(exc).__name__, exc)
        diagnosis = {"error": f"{type(exc).__name__}: {exc}"}
    if not diagnosis:
        return
    diagnosis = {**diagnosis, "seconds": round(time.perf_counter() - start, 2)}
    report.diagnosis = diagnosis
    exported.manifest.setdefault("verification", {})["diagnosis"] = diagnosis
    exported._section(exported.default_component).setdefault("verification", {})["diagnosis"] = diagnosis
