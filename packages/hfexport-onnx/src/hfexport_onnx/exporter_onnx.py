"""OnnxExporter: the dynamo trace, then ``torch.onnx.export`` to ``model.onnx`` + ``model.onnx.data``, run on ORT.

The file follows the pipeline: the exporter, whose ``prepare`` and ``lower`` run the five documented stages and,
between them, the toolchain steps; then under each ``# ── Stage N: Title ──`` banner the workarounds of that stage.

1. Torch patches — ``@register_patch("onnx", ...)``, active while capturing and lowering.
2. ONNX patches — ``@register_patch("onnx.decomposition", ...)``: patches of torch.onnx's internals (one re-runs
   the FX node fixes right after ``run_decompositions`` inside ``torch.onnx.export``).
   → capture: the dynamo stages, then ``torch.export.export`` (the kernel's pipeline, ``DYNAMO_TRACER.capture``).
3. FX node fixes — ``@register_fx_node_fix("onnx")`` rewrites of the captured program.
4. ONNX translations — ``_aten_*`` functions (``@register_workaround("onnx_translation", "onnx", target=...)``).
   → ``torch.onnx.export`` with that table.
5. ONNX IR fixes — ``_fix_ir_*`` functions (``@register_workaround("onnx_ir_fix", "onnx")``).
   → ``onnxscript optimizer`` (skipped with ``optimize=False`` or for a class in ``ONNX_DISABLE_OPTIMIZE``; a crash
   keeps the unoptimized model, or fails with ``optimize_fallback=False``) → ``onnxscript ort_fusions`` (ONNX
   Runtime's fused ops, ``ort_fusions="cpu"`` by default: ``_fusions.py``) → with ``quantize=``, ONNX Runtime's
   quantization (``_quantize.py``) → ``onnxruntime.InferenceSession``.

Every workaround can be left out by name with ``disable=("<function name>",)``; its docstring says **Why**,
**Upstream** and **Remove when**. The runner, I/O names, opset check, metadata and failure texts are private
modules of the package.
"""
from __future__ import annotations

import contextlib
import time
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import onnx_ir as ir
import torch
from onnxscript import opset18 as op

from hfexport import Quantization
from hfexport.plugin import (
    Component,
    ExportConfig,
    ExportContext,
    ExportedModel,
    Exporter,
    Registration,
    RuntimeNeeds,
    Stage,
    Step,
    artifact_file,
    component_manifest,
    register_fx_node_fix,
    register_patch,
    register_workaround,
)
from hfexport.quantization import check_quantization_inputs
from hfexport.workarounds import apply_fx_node_fixes, workarounds_for
from hfexport_dynamo import DYNAMO_TRACER, squeeze_only_size_one_dims

from ._attention import lowerings
from ._config import OnnxConfig
from ._errors import (
    OnnxConversionError,
    OnnxSessionError,
    OptimizerFallbackWarning,
    failure_text,
    onnx_hints,
    quiet_onnx_passes,
    quiet_torch_onnx,
)
from ._export_cost import _patch_torchlib_registry_built_once  # noqa: F401 - registers it
from ._fusions import ORT_FUSIONS_DISABLE, OrtFusionFallbackWarning, fuse_and_open
from ._model import TORCHLIB_OPSET, UnsupportedOpsetError, check_opset, drop_machine_metadata, node_count
from ._naming import io_names, name_graph_io
from ._optimizer_cost import _patch_multi_output_match_checks_its_anchor_first  # noqa: F401 - registers it
from ._optimizer_rules import _patch_identity_constants_match_exactly  # noqa: F401 - registers it
from ._quantize import quantization_section, quantize_model
from ._runner import (
    DATA_FILE,
    MODEL_FILE,
    OnnxRunner,
    in_place_outputs,
    providers_for,
)
from ._state import OnnxState, onnx_state
from ._untrusted import check_onnx_file

__all__ = ["MODEL_FILE", "ONNX_DISABLE_OPTIMIZE", "ORT_FUSIONS_DISABLE", "OnnxConfig", "OnnxConversionError",
           "OnnxExporter", "OnnxRunner", "OnnxSessionError", "OptimizerFallbackWarning", "OrtFusionFallbackWarning",
           "UnsupportedOpsetError", "translation_table"]

aten = torch.ops.aten

# Model class -> the upstream onnxscript bug that makes the optimizer unusable for it. Only entries that were
# reproduced on the pinned toolchain; the optimizer-crash fallback (stage 5) already covers unknown ones, so an
# entry only saves the failed attempt and its re-export. Expected to shrink; the sweep re-checks each entry
# through OnnxExporter.known_failures() and recheck_options().
ONNX_DISABLE_OPTIMIZE: dict[str, str] = {}


class OnnxExporter(Exporter):
    """Export to ONNX (``model.onnx`` + ``model.onnx.data``), verified on ONNX Runtime."""

    name: ClassVar[str] = "onnx"
    config_class: ClassVar[type[ExportConfig]] = OnnxConfig
    tracer = DYNAMO_TRACER
    scopes: ClassVar[tuple[str, ...]] = ("dynamo", "onnx", "onnx.decomposition")
    # The tracer's toolchain (torch, transformers, ...) as hfexport-dynamo declares and tested it, plus ONNX's.
    toolchain: ClassVar[tuple[str, ...]] = (*DYNAMO_TRACER.toolchain, "onnx", "onnxscript", "onnx-ir", "onnxruntime",
                                            "hfexport-onnx")
    tested_versions: ClassVar[dict[str, str]] = {**DYNAMO_TRACER.tested_versions, "onnx": "1.23.2",
                                                 "onnxscript": "0.7.2", "onnx-ir": "1.1.0", "onnxruntime": "1.32.0"}
    # A generation program's attention as ONNX Runtime's GroupQueryAttention (_attention.py), except for plain
    # ONNX ops (ort_fusions=None)
    NEEDS: ClassVar[RuntimeNeeds] = RuntimeNeeds(cache_layout="io", attention="hfexport::cache_attention")
    stages: ClassVar[tuple[Stage, ...]] = (
        Stage(1, "Torch patches", '@register_patch("onnx", ...)'),
        Stage(2, "ONNX patches", '@register_patch("onnx.decomposition", ...)'),
        Stage(3, "FX node fixes", '@register_fx_node_fix("onnx")'),
        Stage(4, "ONNX translations", "_ONNX_TRANSLATION_TABLE"),
        Stage(5, "ONNX IR fixes", "_IR_FIXES"),
    )
    steps: ClassVar[tuple[Step, ...]] = (
        Step(2, "capture", "the dynamo stages, torch.export.export"),
        Step(4, "convert", "torch.onnx.export"),
        Step(5, "optimize", "onnxscript optimizer"),
        Step(5, "fuse", "onnxscript ort_fusions"),
        Step(5, "quantize", "onnxruntime.quantization (with quantize=)"),
        Step(5, "open", "onnxruntime.InferenceSession"),
    )

    @property
    def needs(self) -> RuntimeNeeds:  # type: ignore[override]
        """:attr:`NEEDS`, but plain attention ops where the config asks for plain ONNX ops (``ort_fusions=None``)."""
        return self.NEEDS if self.onnx_config.ort_fusions is not None else RuntimeNeeds(cache_layout="io")

    @property
    def onnx_config(self) -> OnnxConfig:
        """This exporter's config, typed."""
        return self.config_as(OnnxConfig)

    def new_state(self, ctx: ExportContext) -> OnnxState:
        return OnnxState()

    def prepare(self, ctx: ExportContext) -> None:
        """Stages 1 and 2: the patches the capture and ``torch.onnx.export`` run under."""
        with ctx.stage(1):
            ctx.install_patches(("onnx",))
        with ctx.stage(2):
            ctx.install_patches(("onnx.decomposition",))

    def lower(self, ctx: ExportContext) -> None:
        """Stages 3-5 and the steps between them, top to bottom: the captured program to an ONNX Runtime session."""
        state, config = onnx_state(ctx), self.onnx_config
        with ctx.stage(3):
            ctx.apply_fx_node_fixes(ctx.program.graph_module, ("onnx",))
        with ctx.stage(4):
            table = translation_table(config.disable, config.opset_version)
            state.translations = sorted({fn.__name__ for fn in table.values()})
        program = self._convert(ctx, table)  # step torch.onnx.export
        with ctx.stage(5):
            fixes = ctx.workarounds(_IR_FIXES, ("onnx",))
            applied = apply_ir_fixes(program.model, fixes)
            for fix in fixes:
                if fix.name in applied:
                    ctx.record_applied(fix.qualified_name, applied[fix.name])
        with quiet_onnx_passes():  # the optimizer's and fusions' recoverable failures: in the manifest
            # What an optimizer crash and a failed fusion fall back to (both rewrite the graph in place): a copy of the
            # graph, its weights shared. Converting the program again cost a second torch.onnx.export, and failed
            # where the decomposition had made unbacked symbols (PendingUnbackedSymbolNotFound: Inkling2's image).
            unoptimized = program.model.clone()
            not_optimized_because, seconds, crashed = self._optimize(ctx, program)  # step onnxscript optimizer
            if crashed:
                program.model = unoptimized.clone()

            def unfused() -> ir.Model:  # what a fusion that fails falls back to: the converted graph, optimized, unfused
                program.model = unoptimized.clone()
                program.optimize()
                return program.model

            def open_runner(model: ir.Model, fusions: dict[str, Any]) -> OnnxRunner:
                final = model
                if isinstance(config.quantize, Quantization):  # quantized last, if asked
                    final, state.quantization = quantize_model(ctx, model, config.quantize, state.io["input_leaves"])
                drop_machine_metadata(final)  # the exporting machine's paths stay on it
                return OnnxRunner.from_model(final, config.providers, {**state.io, "fusions": fusions,
                                                                       "in_place_outputs": in_place_outputs(final)})

            model, state.runner, fusions = fuse_and_open(  # steps onnxscript ort_fusions, InferenceSession
                ctx, program.model, unfused, open_runner, target=config.ort_fusions,
                not_optimized_because=not_optimized_because, strict=not config.optimize_fallback)
        state.manifest = {
            "model_file": MODEL_FILE,
            "data_file": DATA_FILE,
            "opset": model.opset_imports.get("", None),
            "opset_requested": config.opset_version,
            "optimized": not_optimized_because is None,
            "not_optimized_because": not_optimized_because,
            "optimize_s": round(seconds, 4),
            "providers": list(config.providers),
            "node_count": node_count(model),
            "fusions": fusions,
            "ir_fixes": applied,
            "translations": state.translations,
            "fixes_after_decomposition": state.decomposition_fixes.applied,
            **state.io,
            "in_place_outputs": state.runner.io["in_place_outputs"],
        }

    # ── the toolchain steps ─────────────────────────────────────────────────────────
    def _convert(self, ctx: ExportContext, table: Mapping[Any, Callable[..., Any]]) -> Any:
        """``torch.onnx.export`` of ``ctx.program`` (unoptimized), with readable input and output names."""
        state, config = onnx_state(ctx), self.onnx_config
        io = state.io = io_names(ctx.program, ctx.inputs)
        state.decomposition_fixes.applied.clear()  # this conversion's only (a fallback re-converts)
        with ctx.step("torch.onnx.export"):
            try:
                # no_grad: torch.onnx's type-promotion pass re-runs the graph, and with autograd on a
                # higher_order.scan (hfexport_dynamo._recurrences: Mamba, Canine) saves a SymInt for backward
                # ("Expected leaf to be a Tensor or None, got SymInt"); the exported graph is inference-only.
                with quiet_torch_onnx(), torch.no_grad():
                    program = torch.onnx.export(ctx.program, (), dynamo=True,
                                                custom_translation_table=dict(table) or None, optimize=False,
                                                opset_version=config.opset_version,
                                                output_names=[n for n in io["output_leaves"] if n is not None],
                                                verbose=False, report=False)
            except Exception as exc:
                # torch.onnx wraps the real failure (a missing op, a decomposition error) in a generic
                # ConversionError: lead with the innermost one, which names the op or node.
                raise OnnxConversionError(f"torch.onnx.export failed: {failure_text(exc)}") from exc
            check_opset(program.model, config.opset_version)  # what the conversion wrote: the opset asked for?
        name_graph_io(program.model.graph, io)
        return program

    def _optimize(self, ctx: ExportContext, program: Any) -> tuple[str | None, float, bool]:
        """Run the onnxscript optimizer on ``program`` unless the config or ``ONNX_DISABLE_OPTIMIZE`` says not to.

        Returns:
            ``(why it was not optimized or None, seconds, whether it crashed)``; a crash warns (or raises with
            ``optimize_fallback=False``) and the caller re-exports.
        """
        config = self.onnx_config
        if not config.optimize:
            return "OnnxConfig(optimize=False)", 0.0, False
        if ctx.model_class in ONNX_DISABLE_OPTIMIZE and config.optimize_fallback:
            return f"ONNX_DISABLE_OPTIMIZE[{ctx.model_class!r}]: {ONNX_DISABLE_OPTIMIZE[ctx.model_class]}", 0.0, False
        start = time.perf_counter()
        with ctx.step("onnxscript optimizer"):
            try:
                program.optimize()  # onnxscript's optimizer, what torch.onnx.export(optimize=True) runs
                return None, time.perf_counter() - start, False
            except Exception as exc:  # never lose the export: keep the unoptimized model, and say so
                if not config.optimize_fallback:
                    raise
                failure = failure_text(exc)
        warnings.warn(f"the onnxscript optimizer failed on {ctx.model_class} ({failure}); keeping the unoptimized "
                      "ONNX model (outputs are the same, it may run slower)", OptimizerFallbackWarning, stacklevel=2)
        ctx.note(f"onnxscript optimizer failed ({failure}); the unoptimized model was kept")
        return f"optimizer failed: {failure}", time.perf_counter() - start, True

    # ── artifact, loading, known failures, hints ──────────────────────────────────────────────────────
    def package(self, ctx: ExportContext) -> ExportedModel:
        state = onnx_state(ctx)
        runner = state.runner
        if runner is None:
            raise RuntimeError("package() runs after lower(), which opens the runner")
        section = {"program_file": MODEL_FILE, "onnx": state.manifest, **quantization_section(state.quantization)}
        return self.artifact(ctx, [Component("model", runner, ctx.program.call_spec.out_spec, runner.write_files,
                                             section, ctx.program)])

    def check_inputs(self, inputs: Any, model: Any = None) -> None:
        """The kernel's checks, then ``quantize``'s: a model quantized already is refused before any work."""
        super().check_inputs(inputs, model)
        config = self.onnx_config
        check_quantization_inputs(config.quantize, inputs, model, backend=self.name,
                                  static_shapes=not config.dynamic and not config.dynamic_shapes)

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = "model", *,
                    trust_remote_code: bool = False) -> OnnxRunner:
        """Open ``model.onnx`` on ONNX Runtime with the providers it was exported for (those installed).

        The ONNX file is read as untrusted input: every external-data file it names must be one the manifest
        lists (so its path and SHA-256 were checked). ONNX Runtime runs no code from a model file; without
        ``trust_remote_code`` its constant folding is left out (the file's constants were folded at export), so
        that opening the session computes nothing the file dictates.
        """
        section = component_manifest(manifest, component).get("onnx", {})
        where = f"components[{component!r}].onnx"
        model_path = artifact_file(path, manifest, section.get("model_file"), f"{where}.model_file")
        data = section.get("data_file")
        data_path = artifact_file(path, manifest, data, f"{where}.data_file") if data is not None else None
        check_onnx_file(model_path, path, list(manifest.get("files_sha256") or manifest.get("files") or []))
        return OnnxRunner(model_path, providers_for(section), section,
                          data_path=data_path if data_path is not None and data_path.is_file() else None,
                          untrusted=not trust_remote_code)

    @classmethod
    def known_failures(cls) -> dict[str, dict[str, str]]:
        return {"ONNX_DISABLE_OPTIMIZE": dict(ONNX_DISABLE_OPTIMIZE), "ORT_FUSIONS_DISABLE": dict(ORT_FUSIONS_DISABLE)}

    @classmethod
    def recheck_options(cls, list_name: str, model_class: str) -> dict[str, Any]:
        """``ONNX_DISABLE_OPTIMIZE``: the optimizer on even for a listed class, and its crash an error;
        ``ORT_FUSIONS_DISABLE``: the fusions too, and a fusion that fails an error."""
        if list_name not in ("ONNX_DISABLE_OPTIMIZE", "ORT_FUSIONS_DISABLE"):
            raise KeyError(f"the onnx backend has no known-failure list {list_name!r}; it has "
                           f"{sorted(cls.known_failures())}")
        fusions = {"ort_fusions": "cpu"} if list_name == "ORT_FUSIONS_DISABLE" else {}
        return {"optimize": True, "optimize_fallback": False, **fusions}

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        return onnx_hints(exc) or super().hints_for(stage, exc)


# ── Stage 1: Torch patches ──
def _float_scalar_with_int_tensor(tensor: Any, other: Any) -> bool:
    return (isinstance(tensor, torch.Tensor) and isinstance(other, float) and not tensor.dtype.is_floating_point
            and not tensor.dtype.is_complex and tensor.dtype != torch.bool)


@register_patch("onnx", "torch.Tensor.__rsub__")
def _patch_tensor_rsub(original: Any) -> Any:
    """``python_float - int_tensor``: cast the tensor to the promoted float dtype before subtracting.

    **Why**: ``1.0 - int_mask`` (additive attention masks, c18) traces to ``aten.rsub.Scalar(int_tensor, 1.0)``;
    its ONNX decomposition emits ``aten.sub.Tensor(1.0, int_tensor)`` and the type-promotion pass then raises
    ``RuntimeError: Cannot find a compatible OpOverload for aten.sub`` (ConversionError, torch.onnx step 2/3).
    Of the python-float ⊕ int-tensor operators (``+ - * / **``, ``where``, ``clamp``, ``masked_fill``) only the
    reflected subtraction fails. Casting first is exactly eager's promotion (``result_type(int, float)`` is the
    default float dtype).
    **Upstream**: pytorch/pytorch#194381 (regression in 2.13; fix proposed in pytorch/pytorch#194522); history
    in microsoft/onnxscript#1907 and #2137.
    **Remove when**: pytorch/pytorch#194381 is fixed in the minimum torch (c18 exports without this patch and
    ``_fix_sub_scalar_int_tensor``).
    """

    def __rsub__(self: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
        if _float_scalar_with_int_tensor(self, other):
            self = self.to(torch.get_default_dtype())
        return original(self, other, *args, **kwargs)

    return __rsub__


@register_patch("onnx", "torch.rsub")
def _patch_torch_rsub(original: Any) -> Any:
    """``torch.rsub(int_tensor, python_float)``: cast the tensor first, as ``_patch_tensor_rsub`` does.

    **Why**: ``torch.rsub`` traces to the same ``aten.rsub.Scalar`` and fails the same way in the ONNX
    type-promotion pass (``Cannot find a compatible OpOverload for aten.sub``).
    **Upstream**: pytorch/pytorch#194381 (fix proposed in pytorch/pytorch#194522).
    **Remove when**: pytorch/pytorch#194381 is fixed in the minimum torch.
    """

    def rsub(input: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
        if _float_scalar_with_int_tensor(input, other):
            input = input.to(torch.get_default_dtype())
        return original(input, other, *args, **kwargs)

    return rsub


# ── Stage 2: ONNX patches ──
@register_patch("onnx.decomposition", "torch.onnx._internal.exporter._fx_passes.decompose_with_registry")
def _patch_decompose_with_registry(original: Any, ctx: ExportContext | None = None) -> Any:
    """Re-run the ONNX FX node fixes on the program that ``run_decompositions`` returns inside torch.onnx.

    **Why**: ``torch.onnx.export`` decomposes the program again (``_core._prepare_exported_program_for_export``
    → ``_fx_passes.decompose_with_registry``, its only call of ``run_decompositions``) and then runs its
    type-promotion pass on the result. Some patterns exist only in the decomposed graph and break that pass:
    ``aten.rsub.Scalar(int_tensor, 1.0)`` becomes ``aten.sub.Tensor(1.0, int_tensor)``, which fails with
    ``Cannot find a compatible OpOverload for aten.sub`` (c18 traced without ``_patch_tensor_rsub``). Running
    the FX node fixes between the two steps lets ``_fix_sub_scalar_int_tensor`` rewrite it. The fixes to run
    come from the export (``disable`` respected): the factory receives the export's context (torch.onnx calls the
    hook with the program and registry only).
    **Upstream**: pytorch/pytorch#194381 (the pattern this hook exists for); the hook is a private torch.onnx
    function (``torch/onnx/_internal/exporter/_fx_passes.py``).
    **Remove when**: torch.onnx offers a post-decomposition hook, or no FX node fix needs the decomposed
    graph. If torch moves the call, hook the new caller of ``ExportedProgram.run_decompositions`` in ``_core.py``.
    """

    def decompose_with_registry(exported_program: Any, registry: Any, *args: Any, **kwargs: Any) -> Any:
        program = original(exported_program, registry, *args, **kwargs)
        if ctx is not None:
            apply_fx_node_fixes(program.graph_module, ctx.workarounds("fx_node_fix", ("onnx",)),
                                onnx_state(ctx).decomposition_fixes, ctx=ctx)
        return program

    return decompose_with_registry


@register_patch("onnx.decomposition", "torch.onnx._internal.exporter._core._handle_output_node")
def _patch_constant_outputs_left_out(original: Any) -> Any:
    """Leaves a program's constant outputs (a Python int, float, bool or str in the output node) out of the ONNX
    graph, as torch.onnx already leaves out ``None`` (with a warning each); the manifest's ``output_constants`` puts
    them back.

    **Why**: torch.onnx translates the output node by reading ``.name`` of every output but ``None``. A model that
    returns ints beside its tensors fails: Granite 4 Vision's ``Granite4VisionModel`` returns its deepstack
    features as ``(layer index, features)`` pairs, ``ConversionError: Error when translating node return (mul_160,
    0, cat_3, 1, ...)`` ← ``AttributeError: 'int' object has no attribute 'name'``. hfexport names only the
    tensor outputs (``io_names``) and the runner rebuilds the output pytree with the constants, so leaving them
    out of the graph loses nothing.
    **Upstream**: pytorch/pytorch#160150 (open: the output node's non-tensor outputs in the same function,
    ``torch/onnx/_internal/exporter/_core.py``'s ``_handle_output_node``; ``None`` is skipped since, constants are
    not).
    **Remove when**: torch.onnx skips (or emits) constant outputs; a module returning ``(x + 1, 3)`` then exports
    with ``disable=("_patch_constant_outputs_left_out",)``.
    """

    def handle_output_node(node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
        outputs = node.args[0]
        if isinstance(outputs, (tuple, list)) and any(_is_constant(o) for o in outputs):
            # The original reads only the node's args and name; a stand-in keeps the graph's users untouched.
            node = types.SimpleNamespace(name=node.name, args=([o for o in outputs if not _is_constant(o)],))
        return original(node, *args, **kwargs)

    return handle_output_node


def _is_constant(output: Any) -> bool:
    return isinstance(output, (int, float, bool, str))


# ── Stage 3: FX node fixes ──
# Applied to the traced program, and again by ``_patch_decompose_with_registry`` (stage 2) to the program
# torch.onnx decomposes.
def _is_int_tensor_node(arg: Any) -> bool:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return (isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and not val.dtype.is_complex
            and val.dtype != torch.bool)


@register_fx_node_fix("onnx")
def _fix_sub_scalar_int_tensor(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``aten.sub.Tensor(1.0, int_tensor)`` by ``aten.sub.Tensor(1.0, _to_copy(int_tensor, float))``.

    **Why**: ``1.0 - int_mask`` traced without ``_patch_tensor_rsub`` is ``aten.rsub.Scalar(int_tensor, 1.0)``;
    torch.onnx's ``run_decompositions`` turns it into ``aten.sub.Tensor(1.0, int_tensor)`` (a Python float as
    the first operand), and the type-promotion pass that runs next raises ``RuntimeError: Cannot find a
    compatible OpOverload for aten.sub`` (ConversionError, torch.onnx step 2/3; c18). The pattern exists only
    in the decomposed graph, so this fix fires through ``_patch_decompose_with_registry`` (stage 2). Casting the
    tensor to the node's output dtype first is eager's promotion.
    **Upstream**: pytorch/pytorch#194381 (regression in 2.13; fix proposed in pytorch/pytorch#194522).
    **Remove when**: pytorch/pytorch#194381 is fixed in the minimum torch.
    """
    if (node.op != "call_function" or node.target is not aten.sub.Tensor or len(node.args) < 2
            or not isinstance(node.args[0], float) or not _is_int_tensor_node(node.args[1])):
        return False
    x = node.args[1]
    val = x.meta["val"]
    out_val = node.meta.get("val")
    dtype = out_val.dtype if isinstance(out_val, torch.Tensor) else torch.get_default_dtype()
    with gm.graph.inserting_before(node):
        cast = gm.graph.call_function(aten._to_copy.default, (x,), {"dtype": dtype})
    cast.meta = {k: v for k, v in node.meta.items() if k != "val"}  # keeps nn_module_stack for torch.onnx
    fake_mode = getattr(val, "fake_mode", None)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        cast.meta["val"] = val.to(dtype)
    node.replace_input_with(x, cast)
    return True


@register_fx_node_fix("onnx")
def _fix_bitwise_shift_spellings(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces every spelling of a shift (``__rshift__``/``__lshift__`` ``.Tensor``/``.Scalar``,
    ``bitwise_*_shift.Tensor_Scalar``/``.Scalar_Tensor``) by ``bitwise_{right,left}_shift.Tensor(a, b)``, a scalar
    operand as a 0-d tensor of the result's dtype (``_bitwise.shift_as_tensor_op``).

    **Why**: torchlib registers ``__rshift__.Tensor`` and ``__lshift__.Tensor`` (``x >> amounts``, s50; the int2
    unpacking ``(packed >> shifts) & 3``, s51) only as ``_operator::__rshift__``: ``DispatchError: No ONNX
    function found for <OpOverload(op='aten.__rshift__', overload='Tensor')>``; and the other spellings would
    reach torchlib's signed-only lowering, not ``_aten_bitwise_right_shift``. One overload per direction, one
    translation each.
    **Upstream**: none found for the missing registrations (torchlib ``ops/core.py``; tracker
    microsoft/onnxscript#258).
    **Remove when**: torchlib registers every shift overload with unsigned dtypes kept (s51 exports with
    ``disable=("_fix_bitwise_shift_spellings",)``).
    """
    from ._bitwise import shift_as_tensor_op

    return shift_as_tensor_op(gm, node)


@register_fx_node_fix("onnx")
def _fix_squeeze_dims_torch_keeps(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Drops from ``aten.squeeze.dims`` the dims that torch leaves in place, those whose traced size is not the
    integer 1 (``hfexport_dynamo.squeeze_only_size_one_dims``, shared with OpenVINO's fix of the same name).

    **Why**: torch's ``squeeze(dims)`` skips a dim whose size is not 1; torchlib translates it to ONNX ``Squeeze``
    with every listed axis, which ONNX Runtime refuses when one is not 1. Mistral3 and Mistral-Large-4 with their
    image (Pixtral's ``image_features.squeeze(0)`` of a ``[16, 64]`` feature map) failed to open: ``Node
    (node_squeeze_1) Op (Squeeze) [ShapeInferenceError] Dimension of input 0 must be 1 instead of 16``; on a
    dynamic dim the model fails at inference instead, whenever the size is not 1.
    **Upstream**: microsoft/onnxscript#360 ("Squeeze may remove dims unintended", closed; torchlib's
    ``aten_squeeze_dim`` still emits ``Squeeze(self, [dim])`` unconditionally in onnxscript 0.7.2).
    **Remove when**: a module returning ``x.squeeze(0)`` of a ``[16, 4]`` tensor exports and runs with
    ``disable=("_fix_squeeze_dims_torch_keeps",)``.
    """
    return squeeze_only_size_one_dims(node)


# ── Stage 4: ONNX translations ──
# Plain Python functions over onnxscript ops (traced, not scripted); torch.onnx wraps them and they take
# precedence over torchlib's functions for the same overload. Registered as the "onnx_translation" kind with
# their ``target`` op (and ``below_opset`` when torchlib lowers the op better from that opset on).
_ONNX_TRANSLATION_TABLE = "onnx_translation"  # the registry kind of stage 4 (its extension point)


def _topk_all(self: Any, dim: int, descending: bool) -> Any:
    # TopK(sorted=1) puts the lower index first among equal values: a stable sort, in both directions.
    size = op.Gather(op.Shape(self), op.Constant(value_ints=[dim]), axis=0)
    return op.TopK(self, size, axis=dim, largest=1 if descending else 0, sorted=1)


@register_workaround("onnx_translation", "onnx", target=aten.sort.stable)
def _aten_sort_stable(self: Any, stable: bool | None = None, dim: int = -1, descending: bool = False) -> Any:
    """``aten.sort.stable`` → ``TopK(X, k=size(dim), sorted=1)`` (values and indices).

    **Why**: ``torch.sort(x, stable=True)`` selects the ``sort.stable`` overload, which torchlib does not
    register: ``DispatchError: No ONNX function found for <OpOverload(op='aten.sort', overload='stable')>``
    (c21). ``torch.argsort(x, stable=True)`` decomposes to the same overload and fails the same way (torchlib's
    ``aten_argsort`` is a stub). ONNX ``TopK`` with ``sorted=1`` breaks ties by lower index, which is a stable
    sort, so the flag is honoured, not only accepted.
    **Upstream**: pytorch/pytorch#95613; fix proposed in microsoft/onnxscript#3053.
    **Remove when**: microsoft/onnxscript#3053 (or an equivalent) is in the minimum onnxscript.
    """
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    values, indices = _topk_all(self, dim, descending)
    return values, indices


@register_workaround("onnx_translation", "onnx", target=aten._is_all_true.default)
def _aten_is_all_true(self: Any) -> Any:
    """``aten._is_all_true`` → ``Cast(ReduceMin(Cast(x, int64)), bool)``: a 0-d bool, true for an empty tensor
    (ReduceMin's identity is the largest int64), as ``torch.all``.

    **Why**: torchlib has no function for it: ``DispatchError: No ONNX function found for
    <OpOverload(op='aten._is_all_true', overload='default')>``. torch.export writes it for a ``torch._check`` on a
    tensor condition, such as the LLaVA family's check that the image placeholder tokens match the image features
    (``get_placeholder_mask``), so every vision-language model of that family fed an image failed on ONNX.
    **Upstream**: torchlib's ATen coverage tracker, microsoft/onnxscript#258, has no entry for ``_is_all_true``
    (no issue of its own found).
    **Remove when**: torchlib translates ``aten._is_all_true`` (the zoo's LLaVA exports with
    ``disable=("_aten_is_all_true",)``).
    """
    return op.Cast(op.ReduceMin(op.Cast(self, to=ir.DataType.INT64), keepdims=0), to=ir.DataType.BOOL)


@register_workaround("onnx_translation", "onnx", target=aten.searchsorted.Tensor)
def _aten_searchsorted(sorted_sequence: Any, self: Any, *, out_int32: bool = False, right: bool = False,
                       side: str | None = None, sorter: Any = None) -> Any:
    """``aten.searchsorted.Tensor`` → ``ReduceSum(Not(GreaterOrEqual(seq, v)))`` over the searched axis.

    The index is the number of boundaries that do not reach the value (``Greater`` when ``right``/``side="right"``):
    eager's answer for sorted boundaries, NaN included (``len(seq)``); ``sorter`` gathers the sequence first. The
    same comparison-and-sum as ExecuTorch's decomposition (hfexport_executorch/_decompositions.py), so the number
    of boundaries may be dynamic.

    **Why**: torchlib has no function for it: ``DispatchError: No ONNX function found for
    <OpOverload(op='aten.searchsorted', overload='Tensor')>`` (packed-sequence ids from cumulative lengths, s30).
    **Upstream**: none found for ``searchsorted`` (its sibling ``bucketize`` was microsoft/onnxscript#1659, now
    implemented by a decomposition whose loop needs a static boundary count); ONNX has no SearchSorted op.
    **Remove when**: torchlib translates ``aten.searchsorted.Tensor`` (s30 exports with
    ``disable=("_aten_searchsorted",)``).
    """
    seq = sorted_sequence if sorter is None else op.GatherElements(sorted_sequence, sorter, axis=-1)
    if len(sorted_sequence.shape) > 1:  # the gathered value has no shape yet
        seq = op.Unsqueeze(seq, op.Constant(value_ints=[-2]))  # [..., 1, M] against [..., K, 1]
    values = op.Unsqueeze(op.CastLike(self, seq), op.Constant(value_ints=[-1]))
    reached = op.Greater(seq, values) if (right or side == "right") else op.GreaterOrEqual(seq, values)
    count = op.ReduceSum(op.Cast(op.Not(reached), to=ir.DataType.INT64), op.Constant(value_ints=[-1]), keepdims=0)
    return op.Cast(count, to=ir.DataType.INT32) if out_int32 else count


@register_workaround("onnx_translation", "onnx", target=aten.sym_numel.default)
def _aten_sym_numel(self: Any) -> Any:
    """``aten.sym_numel`` → ``Size(x)``: the element count as a 0-d int64, as torchlib gives ``sym_size.int``.

    **Why**: torchlib has no function for it: ``DispatchError: No ONNX function found for
    <OpOverload(op='aten.sym_numel', overload='default')>``. It stays in the program for ``tensor.numel()`` of a tensor
    whose size is data-dependent: PaddleOCR-VL checks ``n_image_tokens * hidden == image_features.numel()`` on its
    packed image features, so that model fed an image failed on ONNX.
    **Upstream**: torchlib's ATen coverage tracker, microsoft/onnxscript#258, has no entry for ``sym_numel`` (no issue
    of its own found).
    **Remove when**: torchlib translates ``aten.sym_numel`` (``test_numel_of_paddleocr_vl_image_features_exports``
    passes with ``disable=("_aten_sym_numel",)``).
    """
    return op.Size(self)


@register_workaround("onnx_translation", "onnx", target=aten.scaled_dot_product_attention.default)
def _aten_scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                       dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                       enable_gqa: bool = False) -> Any:
    """SDPA: torchlib's function, then zero the query rows whose mask hides every key, as eager does.

    Replaces ``SDPA(q, k, v, mask)`` by ``Where(ReduceMax(visible(mask), axis=-1), SDPA(q, k, v, additive), 0)``,
    where ``visible`` is the boolean mask itself (then passed on as the additive ``Where(mask, 0, -inf)``, one
    ``Add`` on the scores instead of torchlib's ``Where`` + ``IsNaN`` + ``Where``), or ``mask != -inf`` for an
    additive float mask.
    **Why**: eager (``_safe_softmax``) returns 0 for a query row that sees no key. torchlib fills a boolean mask
    with the *finite* ``dtype.min``, so such a row gets a uniform softmax (the plain mean of ``v``) and its
    ``IsNaN`` guard never fires: c03, max abs diff 0.93; left-padded batches of Llama/GPT-2 (the padding rows
    are fully masked under the causal mask): 0.05-0.13. An additive float mask whose row is all ``-inf``
    (``(1 - mask) * -inf`` padding, s03) gives ``NaN`` on ONNX Runtime. Rows with at least one visible key, and
    rows masked with a finite minimum (a uniform softmax in eager too), are unchanged.
    **Upstream**: microsoft/onnxscript#2479 and pytorch/pytorch#159973 (the NaN fix this regressed from),
    pytorch/pytorch#103749 (eager's semantics); onnx/onnx#8068 (opset-23 ``Attention`` returns zeros).
    **Remove when**: torchlib's SDPA zeroes fully masked rows for both mask kinds (re-run c03 and s03).
    """
    from onnxscript.function_libs.torch_lib.ops.nn import aten_scaled_dot_product_attention as torchlib_sdpa

    if attn_mask is None:
        return torchlib_sdpa(query, key, value, None, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                             enable_gqa=enable_gqa)
    if attn_mask.dtype == ir.DataType.BOOL:
        visible = attn_mask
        # As an additive mask (0 / -inf, [..., L, S]): torchlib's boolean path masks the [batch, heads, L, S]
        # scores with Where and guards the softmax with IsNaN + Where, three passes over the largest tensor of
        # the layer; the additive path is one Add. Fully masked rows become NaN there and are zeroed below.
        attn_mask = op.Where(attn_mask, op.CastLike(op.Constant(value_float=0.0), query),
                             op.CastLike(op.Constant(value_float=float("-inf")), query))
    else:
        visible = op.Not(op.IsInf(attn_mask, detect_negative=1, detect_positive=0))
    out = torchlib_sdpa(query, key, value, attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
    # True where the query row sees at least one key; [..., L, 1] broadcasts against the output [..., L, Ev].
    sees_any = op.Cast(op.ReduceMax(op.Cast(visible, to=ir.DataType.INT32), op.Constant(value_ints=[-1]),
                                    keepdims=1), to=ir.DataType.BOOL)
    return op.Where(sees_any, out, op.CastLike(op.Constant(value_float=0.0), out))


@register_workaround("onnx_translation", "onnx", target=aten.gelu.default, below_opset=20)
def _aten_gelu(self: Any, approximate: str = "none") -> Any:
    """``aten.gelu(x)`` → ``0.5 * (x * (Erf(x / sqrt(2)) + 1))``, the form both ONNX Runtime's session and
    onnxscript's ``ort_fusions`` fuse into one ``Gelu`` (then ``BiasGelu`` with the bias before it).

    **Why**: at opsets below 20 (no ONNX ``Gelu``) torchlib writes ``x * (0.5 * (1 + Erf(x / sqrt(2))))``.
    ONNX Runtime's ``GeluFusion`` does not match that multiplication order, so every BERT-style MLP runs five
    element-wise kernels over its ``[batch, seq, intermediate]`` activation instead of one (about 8% of
    all-MiniLM-L6-v2's CPU time at batch 8). ``(x * 0.5) * (...)`` is fused by ORT's session but by no rule of
    onnxscript's ``erfgelu`` (which matches ``0.5 * (x * (...))`` and ``x * (0.5 * (...))``, operands in that
    order), so the fused file would keep five ops; this order is matched by both. Same formula, other
    association: equal within float rounding. ``approximate="tanh"`` keeps torchlib's lowering (no CPU fusion
    matches either order); from opset 20 on, torchlib emits ONNX ``Gelu`` and this translation is not used.
    **Upstream**: microsoft/onnxscript#2132 (review: the dynamo graph's ``Mul(0.5)`` order defeats ORT's Gelu
    fusions), microsoft/onnxscript#2495 (an Erf-Gelu rewrite rule, not in the default optimizer),
    microsoft/onnxruntime#3148 (the patterns ``GeluFusion`` matches).
    **Remove when**: torchlib's opset-18 gelu uses a fusable order, or the default opset is 20 or higher.
    """
    from onnxscript.function_libs.torch_lib.ops.nn import aten_gelu as torchlib_gelu

    if approximate != "none":
        return torchlib_gelu(self, approximate=approximate)
    erf = op.Erf(op.Div(self, op.CastLike(op.Constant(value_float=1.4142135623730951), self)))
    x_erf = op.Mul(self, op.Add(erf, op.CastLike(op.Constant(value_float=1.0), self)))
    return op.Mul(op.CastLike(op.Constant(value_float=0.5), self), x_erf)


@register_workaround("onnx_translation", "onnx", target=aten.masked_select.default)
def _aten_masked_select(self: Any, mask: Any) -> Any:
    """``aten.masked_select(x, mask)`` → ``Compress(Reshape(Expand(x), [-1]), Reshape(Expand(mask), [-1]))``: both
    broadcast to their common shape (``Expand`` broadcasts both ways), flattened, the elements where the mask
    holds kept in row-major order; the length is the data's, as eager's.

    **Why**: torchlib's ``aten_masked_select`` is a stub (``NotImplementedError``) and no decomposition applies:
    ``DispatchError: No ONNX function found for aten.masked_select.default`` (e10: scores above a threshold; s52:
    a ``[rows, 1]`` keep flag against ``[rows, 6]``). ONNX's ``Compress`` is the op for it.
    **Upstream**: microsoft/onnxscript#1675 ("[torchlib] Implement aten.masked_select", closed; the function in
    torchlib 0.7.2 still raises).
    **Remove when**: torchlib implements ``masked_select`` (e10 exports with ``disable=("_aten_masked_select",)``).
    """
    values = op.Expand(self, op.Shape(mask))
    keep = op.Expand(mask, op.Shape(values))
    flat = op.Constant(value_ints=[-1])
    return op.Compress(op.Reshape(values, flat), op.Reshape(keep, flat), axis=0)


@register_workaround("onnx_translation", "onnx", target=aten.bitwise_right_shift.Tensor)
def _aten_bitwise_right_shift(self: Any, other: Any) -> Any:
    """``aten.bitwise_right_shift.Tensor`` → ``BitShift(x, k, "RIGHT")`` for unsigned dtypes, torchlib's arithmetic
    shift for signed ones (``_bitwise.bitshift``); every other spelling of ``>>`` becomes this overload first
    (``_fix_bitwise_shift_spellings``).

    **Why**: torchlib casts every shift's result to the *signed* type of its width, so ``uint8 >> 4`` returns int8:
    s50's nibble swap ``(flags >> 4) | (flags << 4)`` came back int8 (``239`` as ``-17``), and s51's
    ``(packed >> shifts) & 3`` failed at session creation (``BitwiseAnd``: ``int8 != uint8``). The packed weights
    of GPTQ/AWQ-style layers (e06) are uint8.
    **Upstream**: none found for the unsigned result type (torchlib ``ops/core.py``, ``aten_bitwise_right_shift``;
    the op family is tracked in microsoft/onnxscript#258).
    **Remove when**: torchlib keeps unsigned dtypes in its shifts (s50 exports with
    ``disable=("_aten_bitwise_right_shift", "_aten_bitwise_left_shift")``).
    """
    from ._bitwise import bitshift

    return bitshift(self, other, "RIGHT")


@register_workaround("onnx_translation", "onnx", target=aten.bitwise_left_shift.Tensor)
def _aten_bitwise_left_shift(self: Any, other: Any) -> Any:
    """``aten.bitwise_left_shift.Tensor`` → ``BitShift(x, k, "LEFT")`` keeping unsigned dtypes (bits shifted out
    are dropped: wraps as eager), torchlib's for signed ones; ``_fix_bitwise_shift_spellings`` brings every
    spelling of ``<<`` here.

    **Why**: as ``_aten_bitwise_right_shift``: torchlib returns int8 for ``uint8 << 4``.
    **Upstream**: none found (torchlib ``aten_bitwise_left_shift``; tracker microsoft/onnxscript#258).
    **Remove when**: torchlib keeps unsigned dtypes in its shifts.
    """
    from ._bitwise import bitshift

    return bitshift(self, other, "LEFT")


def translation_table(disabled: Iterable[str] = (), opset_version: int = TORCHLIB_OPSET) -> dict[Any, Callable[..., Any]]:
    """hfexport's own ops' lowerings (``_attention.py``) and the registered ONNX translations, ``{aten overload:
    function}``, minus those ``disabled`` names and those that do not apply at ``opset_version``."""
    return {**lowerings(), **{r.data["target"]: r.func for r in workarounds_for(_ONNX_TRANSLATION_TABLE, ("onnx",),
                                                                               disabled)
                              if opset_version < r.data.get("below_opset", 10**6)}}


# ── Stage 5: ONNX IR fixes ──
# ``fix(graph) -> int`` rewrites of the ONNX model (the main graph and every function), before the optimizer;
# each returns how many nodes it rewrote. Registered as the "onnx_ir_fix" kind.
_IR_FIXES = "onnx_ir_fix"  # the registry kind of stage 5 (its extension point)


@register_workaround("onnx_ir_fix", "onnx")
def _fix_ir_topk_sorted(graph: ir.Graph | ir.Function) -> int:
    """Replaces ``TopK(sorted=0)`` by ``TopK(sorted=1)``.

    **Why**: ``torch.topk(..., sorted=False)`` lowers to ``TopK(sorted=0)``, whose output order ONNX leaves to
    the runtime. ONNX Runtime returns its heap order, eager CPU returns sorted order for large inputs (a partial
    order for small ones), so the values and indices differ from eager's, and so does anything order-sensitive
    downstream (a gather by position, a cumsum, a returned index list). Sorted order is always a valid
    ``sorted=False`` result; it equals eager wherever eager sorts, and it is deterministic across runtimes and
    providers (ties: lower index first). The set of values is the same either way.
    **Upstream**: pytorch/pytorch#95613 (sort/topk ordering); ONNX ``TopK`` spec (the ``sorted`` attribute).
    **Remove when**: never needed by ONNX semantics; kept while exports are verified against eager.
    """
    changed = 0
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if node.op_type == "TopK" and node.domain in ("", "ai.onnx"):
            attr = node.attributes.get("sorted")
            if attr is not None and attr.value == 0:
                node.attributes["sorted"] = ir.AttrInt64("sorted", 1)
                changed += 1
    return changed


@register_workaround("onnx_ir_fix", "onnx")
def _fix_ir_bfloat16_as_float32(graph: ir.Graph | ir.Function) -> int:
    """Computes a bfloat16 model (or a bfloat16 island of a float32 one) in float32: bfloat16 initializers,
    constants and values become float32, and each ``Cast(to=bfloat16)`` of the model is followed by a
    ``Cast(to=float)``, so the model's own rounding points stay (``_dtypes.bfloat16_as_float32``). bfloat16 graph
    inputs and outputs become float32 (the runner feeds and returns float32); the count of rewrites is in the
    manifest (``onnx.ir_fixes``).

    **Why**: ONNX Runtime's CPU provider has no bfloat16 kernels for most ops: a model ``.to(torch.bfloat16)``
    exports, then fails at session creation, ``NOT_IMPLEMENTED : Could not find an implementation for Add(14)``
    (e05, a whole Roberta), ``MatMul(13)`` (a bfloat16 matmul island in a float32 model, s54). ``Cast`` to and from
    bfloat16 has CPU kernels. float16 is left alone (ONNX Runtime's CPU runs the same Roberta in float16).
    **Upstream**: pytorch/pytorch#143643 ("Full bfloat16 ONNX export fails"), microsoft/onnxruntime#26311
    (bfloat16 MatMul NOT_IMPLEMENTED on CPU).
    **Remove when**: ONNX Runtime's CPU provider runs bfloat16 ``Add``/``MatMul``/``LayerNormalization``/``Softmax``
    (e05 exports with ``disable=("_fix_ir_bfloat16_as_float32",)``); a bfloat16-capable provider can disable it now.
    """
    from ._dtypes import bfloat16_as_float32

    return bfloat16_as_float32(graph)


def apply_ir_fixes(model: ir.Model, fixes: Iterable[Registration]) -> dict[str, int]:
    """Apply each ``_fix_ir_*`` to the main graph and every function; returns ``{name: rewrites}`` (fired only)."""
    applied: dict[str, int] = {}
    for fix in fixes:
        n = sum(int(fix.func(g) or 0) for g in (model.graph, *model.functions.values()))
        if n:
            applied[fix.name] = n
    return applied
