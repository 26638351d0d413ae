"""OnnxExporter: the dynamo trace, then ``torch.onnx.export`` to ``model.onnx`` + ``model.onnx.data``, run on ORT.

The file follows the pipeline: the exporter, whose ``prepare`` and ``lower`` run the five documented stages and,
between them, the toolchain steps; then a ``# ── Stage N: Title ──`` banner per stage, naming the module of
``workarounds/`` that holds its registered workarounds. ``prepare`` first makes torch.onnx build its torchlib
registry once per process and take the program ``lower`` decomposes as decomposed (``_torch_onnx.py``).

1. Torch patches — ``@register_patch("onnx", ...)``, active while capturing and lowering.
2. ONNX patches — ``@register_patch("onnx.internals", ...)``: patches of torch.onnx's and onnxscript's internals.
   → capture: the dynamo stages, then ``torch.export.export`` (the kernel's pipeline, ``DYNAMO_TRACER.capture``).
3. FX node fixes — ``@register_fx_node_fix("onnx")`` rewrites of the captured program.
4. ONNX translations — ``_aten_*`` functions (``@register_workaround("onnx_translation", "onnx", target=...)``).
   → ``ExportedProgram.run_decompositions``: the decomposition ``torch.onnx.export`` runs first (its function, with
   the registry of the translations), then stage 3's fixes again on the decomposed program (patterns only the
   decomposition makes) → ``torch.onnx.export`` of the decomposed program with that table, not decomposed again.
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

import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import onnx_ir as ir
import torch

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
)
from hfexport.quantization import check_quantization_inputs
from hfexport.trust import artifact_bytes
from hfexport.workarounds import apply_fx_node_fixes, workarounds_for
from hfexport_dynamo import DYNAMO_TRACER

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
from ._fusions import ORT_FUSIONS_DISABLE, OrtFusionFallbackWarning, fuse_and_open
from ._model import TORCHLIB_OPSET, UnsupportedOpsetError, check_opset, drop_machine_metadata, node_count
from ._naming import io_names, name_graph_io
from ._quantize import quantization_section, quantize_model
from ._runner import (
    DATA_FILE,
    MODEL_FILE,
    OnnxRunner,
    in_place_outputs,
    providers_for,
)
from ._state import OnnxState, onnx_state
from ._torch_onnx import (
    decompose_with_registry,
    decomposed_already,
    decomposition_settings,
    onnx_registry,
    torch_onnx_pipeline,
)
from ._untrusted import check_onnx_file
from .workarounds import (  # noqa: F401 - registers the workarounds of stages 1 to 5
    ir_fixes,
    node_fixes,
    onnx_patches,
    torch_patches,
    translations,
)

if TYPE_CHECKING:
    from ._genai import GenaiDecoder

__all__ = ["MODEL_FILE", "ONNX_DISABLE_OPTIMIZE", "ORT_FUSIONS_DISABLE", "OnnxConfig", "OnnxConversionError",
           "OnnxExporter", "OnnxRunner", "OnnxSessionError", "OptimizerFallbackWarning", "OrtFusionFallbackWarning",
           "UnsupportedOpsetError", "translation_table"]

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
    checked_on_read: ClassVar[tuple[str, ...]] = ("onnx.model_file", "onnx.data_file")  # load_runner: artifact_bytes
    scopes: ClassVar[tuple[str, ...]] = ("dynamo", "onnx", "onnx.internals")
    # Peak RSS / weight bytes of a text-generation export of the seeded 0.5 B Qwen2 (1,976 MB of fp32 weights): fp32
    # 5,203 MiB, verification included (benchmarks/results/bench_export_memory_onnx.txt, 2026-12-07: the export's
    # session without ORT's prepacked copies, the joined weights streamed; 5,710 MiB before, and 6,741 in
    # bench_generation_0.5b.txt run 4), int4 8,879 MiB (bench_generation_0.5b.txt run 6, 2026-12-03, before those
    # changes); int4's artifact 311 MB (0.16x). Bytes over bytes (the issue's 3.4x/4.5x divide MiB by MB).
    export_peak_ratio: ClassVar[dict[str | None, float]] = {None: 2.8, "int4": 4.7}
    artifact_ratio: ClassVar[dict[str | None, float]] = {None: 1.0, "int4": 0.16}
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
        Stage(2, "ONNX patches", '@register_patch("onnx.internals", ...)'),
        Stage(3, "FX node fixes", '@register_fx_node_fix("onnx")'),
        Stage(4, "ONNX translations", "_ONNX_TRANSLATION_TABLE"),
        Stage(5, "ONNX IR fixes", "_IR_FIXES"),
    )
    steps: ClassVar[tuple[Step, ...]] = (
        Step(2, "capture", "the dynamo stages, torch.export.export"),
        Step(4, "decompose", "ExportedProgram.run_decompositions"),
        Step(4, "convert", "torch.onnx.export"),
        Step(5, "optimize", "onnxscript optimizer"),
        Step(5, "fuse", "onnxscript ort_fusions"),
        Step(5, "quantize", "onnxruntime.quantization (with quantize=)"),
        Step(5, "open", "onnxruntime.InferenceSession"),
        # package: a text-generation decoder also gets ORT GenAI's files (_genai.py); other programs none
        Step(5, "genai", "onnx.save of genai_model.onnx + genai_config.json for onnxruntime-genai (text-generation decoders)"),
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
            ctx.install_patches(("onnx.internals",))

    def lower(self, ctx: ExportContext) -> None:
        """Stages 3-5 and the steps between them, top to bottom: the captured program to an ONNX Runtime session."""
        state, config = onnx_state(ctx), self.onnx_config
        with ctx.stage(3):
            ctx.apply_fx_node_fixes(ctx.program.graph_module, ("onnx",))
        with ctx.stage(4):
            table = translation_table(config.disable, config.opset_version)
            state.translations = sorted({fn.__name__ for fn in table.values()})
        # torch.onnx.export's own first step, run here (its function, registry and settings; no_grad as in _convert),
        # then stage 3's fixes again, for patterns only the decomposition makes (c18: sub.Tensor(1.0, int_tensor)),
        # before torch.onnx's type promotion sees them; what fired is the manifest's onnx.fixes_after_decomposition
        # torch_onnx_pipeline: torch.onnx's registry built once per process, and torch.onnx.export takes the program
        # decomposed here as decomposed
        with torch_onnx_pipeline():
            with decomposition_settings(ctx.program), quiet_torch_onnx(), torch.no_grad():
                with ctx.step("ExportedProgram.run_decompositions"):
                    decomposed = decompose_with_registry(ctx.program, onnx_registry(table, config.opset_version))
                again = ctx.workarounds("fx_node_fix", ("onnx",))
                state.decomposition_fixes = apply_fx_node_fixes(decomposed.graph_module, again, ctx=ctx)
            program = self._convert(ctx, decomposed, table)  # step torch.onnx.export, which takes it as decomposed
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
    def _convert(self, ctx: ExportContext, decomposed: Any, table: Mapping[Any, Callable[..., Any]]) -> Any:
        """``torch.onnx.export`` of the decomposed program (unoptimized), with readable input and output names."""
        state, config = onnx_state(ctx), self.onnx_config
        io = state.io = io_names(ctx.program, ctx.inputs)
        with ctx.step("torch.onnx.export"):
            try:
                # no_grad: torch.onnx's type-promotion pass re-runs the graph, and with autograd on a
                # higher_order.scan (hfexport_dynamo._recurrences: Mamba, Canine) saves a SymInt for backward
                # ("Expected leaf to be a Tensor or None, got SymInt"); the exported graph is inference-only.
                with quiet_torch_onnx(), torch.no_grad(), decomposed_already(decomposed):
                    program = torch.onnx.export(decomposed, (), dynamo=True,
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
        write = runner.write_files
        with ctx.step("onnx.save of genai_model.onnx + genai_config.json for onnxruntime-genai (text-generation decoders)"):
            genai = _genai_files(ctx, state.manifest)
            if genai is not None:  # written beside model.onnx on save; its graph shares model.onnx.data
                write = genai.writer(runner.write_files)
                section["genai"] = genai.manifest
        # ORT GenAI's Model(dir) loads the artifact's root: a text-generation decoder's files go there
        return self.artifact(ctx, [Component("model", runner, ctx.program.call_spec.out_spec, write,
                                             section, ctx.program, at_root=genai is not None)])

    def check_inputs(self, inputs: Any, model: Any = None) -> None:
        """The kernel's checks, then ``quantize``'s: a model quantized already is refused before any work."""
        super().check_inputs(inputs, model)
        config = self.onnx_config
        if config.quantize is not None:
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
        # each file read once by descriptor and checked; ONNX Runtime gets those bytes (the model from memory, the
        # weights as in-memory external data), never the paths again
        model_bytes = artifact_bytes(path, manifest, section.get("model_file"), f"{where}.model_file")
        locations = check_onnx_file(model_path, path, list(manifest.get("files_sha256") or manifest.get("files") or []),
                                    data=model_bytes, trust_remote_code=trust_remote_code)
        served = {data_path.name} if data_path is not None and data_path.parent == model_path.parent else set()
        if locations - served:  # a session over bytes has no folder: every location must be the data file served
            raise ValueError(f"{model_path.name} reads external data from {sorted(locations - served)}, other than "
                             f"its manifest's data_file {data!r}: the artifact is damaged or crafted")
        data_bytes = artifact_bytes(path, manifest, data, f"{where}.data_file") if data is not None else None
        return OnnxRunner(model_path, providers_for(section), section, data_path=data_path,
                          untrusted=not trust_remote_code, model_bytes=model_bytes, data_bytes=data_bytes)

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


def _genai_files(ctx: ExportContext, section: Mapping[str, Any]) -> GenaiDecoder | None:
    """ORT GenAI's files for the program of ``ctx`` when it is a text-generation decoder (``None`` otherwise): the
    cache shapes from the example inputs, the model's facts from the ``config`` and ``generation_config`` the
    decoder program carries (``hfexport_dynamo.tasks.causal_lm.CausalLMStep``)."""
    config = getattr(ctx.model, "config", None)
    cache = ctx.inputs.get("cache")
    if config is None or cache is None or not hasattr(config, "get_text_config"):
        return None
    from ._genai import genai_decoder  # a decoder's export only

    text = config.get_text_config(decoder=True)
    generation = getattr(ctx.model, "generation_config", None)
    fields = generation.to_dict() if generation is not None else {
        k: getattr(text, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    shapes = [list(leaf.shape) for leaf in torch.utils._pytree.tree_leaves(cache) if isinstance(leaf, torch.Tensor)]
    try:
        return genai_decoder(section, shapes, vocab_size=text.vocab_size, hidden_size=text.hidden_size,
                             num_attention_heads=text.num_attention_heads, generation=fields)
    except AttributeError:  # a config without the head counts ORT GenAI's config names
        return None


# ── Stage 1: Torch patches ──
# Registered in workarounds/torch_patches.py (``@register_patch("onnx", ...)``), installed by ``prepare``.

# ── Stage 2: ONNX patches ──
# Registered in workarounds/onnx_patches.py (``@register_patch("onnx.internals", ...)``), installed by ``prepare``.

# ── Stage 3: FX node fixes ──
# Registered in workarounds/node_fixes.py (``@register_fx_node_fix("onnx")``), applied by ``lower`` twice.

# ── Stage 4: ONNX translations ──
# Registered in workarounds/translations.py (the ``_aten_*``), looked up by the registry kind below.
_ONNX_TRANSLATION_TABLE = "onnx_translation"  # the registry kind of stage 4 (its extension point)


def translation_table(disabled: Iterable[str] = (), opset_version: int = TORCHLIB_OPSET) -> dict[Any, Callable[..., Any]]:
    """hfexport's own ops' lowerings (``_attention.py``) and the registered ONNX translations, ``{aten overload:
    function}``, minus those ``disabled`` names and those that do not apply at ``opset_version``."""
    return {**lowerings(), **{r.data["target"]: r.func for r in workarounds_for(_ONNX_TRANSLATION_TABLE, ("onnx",),
                                                                               disabled)
                              if opset_version < r.data.get("below_opset", 10**6)}}


# ── Stage 5: ONNX IR fixes ──
# Registered in workarounds/ir_fixes.py (the ``_fix_ir_*``), looked up by the registry kind below.
_IR_FIXES = "onnx_ir_fix"  # the registry kind of stage 5 (its extension point)


def apply_ir_fixes(model: ir.Model, fixes: Iterable[Registration]) -> dict[str, int]:
    """Apply each ``_fix_ir_*`` to the main graph and every function; returns ``{name: rewrites}`` (fired only)."""
    applied: dict[str, int] = {}
    for fix in fixes:
        n = sum(int(fix.func(g) or 0) for g in (model.graph, *model.functions.values()))
        if n:
            applied[fix.name] = n
    return applied
