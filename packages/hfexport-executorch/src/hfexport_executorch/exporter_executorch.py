"""ExecutorchExporter: dynamo's trace, then ``to_edge_transform_and_lower`` + ``to_executorch`` to ``model.pte``.

Five stages around ExecuTorch's lowering:

1. Backend preparation — ``prepare_for_<variant>`` registered with ``@register_backend_prepare("<variant>")``
   (kind ``executorch_variant``: ``xnnpack``, ``cuda``; vendors add theirs): device, dtype, contiguous inputs,
   partitioners. The model is restored when the export ends. With ``quantize="8da4w"``, then the step
   ``torchao.quantization.quantize_`` on a copy of the model, which is what gets traced (``_quantize.py``).
2. Torch patches — ``@register_patch("executorch", ...)`` and ``@register_patch("executorch.<variant>", ...)``
   for torch ops the ExecuTorch backends do not accept; active while tracing and lowering.
3. ExecuTorch patches — ``@register_patch("executorch.internals", ...)`` (and ``"executorch.<variant>.internals"``):
   ExecuTorch internals that fail on valid graphs (same registry, another scope, so stage 2 does not install them).
4. FX program fixes — dynamo's trace (``hfexport_dynamo.trace``: its five stages nested, then
   ``torch.export.export``), then ``@register_fx_program_fix("executorch")``. With ``quantize="int8"``/
   ``"int8-dynamic"``, between the two: the steps ``prepare_pt2e, calibration, convert_pt2e`` and
   ``torch.export.export (quantized)`` (``_quantize.py``). Then the step ``bound dynamic dims (memory budget)``:
   a finite upper bound for every dynamic dim (``_bounds.py``), default bounds halved while the estimated plan
   exceeds ``memory_budget_gib`` (``_memory_plan.py``).
5. FX node fixes — ``@register_fx_node_fix("executorch")`` (Python sym ops ExecuTorch cannot emit, ``pow`` as a
   ``mul`` chain, ...), then the steps ``to_edge_transform_and_lower`` and ``to_executorch``.

The stage banners below say where each stage's registered workarounds live: ``workarounds/<kind>.py``
(``torch_patches``, ``executorch_patches``, ``xnnpack_patches``, ``node_fixes``); stage 1's variants stand under its
banner. Every one (``_patch_*``, ``_fix_*``, ``prepare_for_*``) can be left out by name with
``disable=("<function name>",)``; ``grep -rnE "^def (_patch_|_fix_|_aten_|prepare_for_)"
packages/hfexport-executorch/src`` lists them, and each docstring says **Why**, **Upstream** and **Remove when**.
What every export needs is pipeline code in ``prepare``/``lower``: the dim bounds and memory budget (the step after
stage 4), the export-cost cache (``_export_cost.py``). The runner, the delegation and memory reports and the variant
registry live in the package's private modules.

executorch itself is imported lazily (inside the stages and the runner), so that importing this module, listing
backends and ``hfexport --help`` stay fast, and a missing install is reported by name.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ClassVar

import torch

from hfexport.plugin import (
    Component,
    ExportContext,
    ExportedModel,
    Exporter,
    RuntimeNeeds,
    Stage,
    Step,
    artifact_file,
    component_manifest,
)
from hfexport.quantization import check_quantization_inputs
from hfexport.trust import artifact_bytes, artifact_descriptor
from hfexport.workarounds import is_disabled
from hfexport_dynamo import DYNAMO_TRACER

from ._bisect import bisect_delegates
from ._bounds import DEFAULT_DIM_UPPER_BOUND, DEFAULT_MAX_BATCH, bound_dynamic_dims
from ._buffers import index_puts_reinplaceable
from ._config import ExecutorchConfig, executorch_config
from ._decompositions import XNNPACK_DECOMPOSITIONS
from ._delegation import delegation_report, planned_memory_bytes, report_planned_memory
from ._export_cost import cia_ops_collected_once
from ._graph import refuse_while_loop
from ._memory_plan import fit_memory_budget, lower_within_budget
from ._quantize import (
    quantization_section,
    quantize_program,
    quantize_source,
    register_quantized_kernels,
)
from ._quiet import quiet_torchao_pytree_warnings, without_lowering_notices
from ._runner import PROGRAM_FILE, ExecutorchRunner, input_dtypes, input_mutations, program_writer
from ._state import ExecutorchState, executorch_state
from ._variants import (
    BackendPreparation,
    place_model_and_inputs,
    register_backend_prepare,
    require_executorch,
    variant_registration,
)
from ._weights import (
    external_weights,
    named_data_on_disk,
    release_lowered_modules,
    shares_weights_with_portable_kernels,
)
from .workarounds import (  # noqa: F401 - they register the workarounds of stages 2, 3 and 5
    executorch_patches,
    node_fixes,
    torch_patches,
    xnnpack_patches,
)

__all__ = ["CudaExporter", "ExecutorchConfig", "ExecutorchExporter", "XnnpackExporter"]

quiet_torchao_pytree_warnings()  # before executorch imports torchao (in the stages): one line per Enum, not ours


# ── Exporter ───────────────────────────────────────────────────────────────────────────────────────────
class ExecutorchExporter(Exporter):
    """Export to an ExecuTorch program (``model.pte``), verified on the ExecuTorch runtime.

    ``variant`` presets the ExecuTorch variant (``XnnpackExporter``, ``CudaExporter``, a vendor's subclass); the
    generic exporter takes it from ``ExecutorchConfig.backend``. What the stages and their fixes hand on within one
    export is its :class:`~hfexport_executorch._state.ExecutorchState` (``ctx.state``).
    """

    name: ClassVar[str] = "executorch"
    variant: ClassVar[str | None] = None
    config_class: ClassVar[type[ExecutorchConfig]] = ExecutorchConfig
    tracer = DYNAMO_TRACER
    # load_runner reads the .pte through artifact_bytes, and hashes the .ptd (executorch.data_file) from the descriptor
    # that the runtime then maps (artifact_descriptor)
    checked_on_read: ClassVar[tuple[str, ...]] = ("executorch.program_file", "program_file", "executorch.data_file")
    # mutable buffers live in planned memory across method calls: a generation program's KV cache stays in place
    needs: ClassVar[RuntimeNeeds] = RuntimeNeeds(cache_layout="in_place")
    # executorch.quantization: installed by quantize="int8" only (its step), listed so that `disable=` and
    # `hfexport workarounds --check` know it
    scopes: ClassVar[tuple[str, ...]] = ("dynamo", "executorch", "executorch.internals", "executorch.quantization")
    toolchain: ClassVar[tuple[str, ...]] = (*DYNAMO_TRACER.toolchain, "executorch", "torchao", "hfexport-executorch")
    tested_versions: ClassVar[dict[str, str]] = {**DYNAMO_TRACER.tested_versions, "executorch": "1.5.1",
                                                 "torchao": "0.18.0"}
    stages: ClassVar[tuple[Stage, ...]] = (  # one stage a line, in the order of the banners below
        Stage(1, "Backend preparation", '@register_backend_prepare("<variant>")'),
        Stage(2, "Torch patches", '@register_patch("executorch", ...)'),
        Stage(3, "ExecuTorch patches", '@register_patch("executorch.internals", ...)'),
        Stage(4, "FX program fixes", '@register_fx_program_fix("executorch")'),
        Stage(5, "FX node fixes", '@register_fx_node_fix("executorch")'),
    )
    steps: ClassVar[tuple[Step, ...]] = (
        Step(1, "quantize weights", "torchao.quantization.quantize_"),  # quantize='8da4w' only
        Step(3, "capture", "the dynamo stages, torch.export.export"),
        Step(3, "quantize", "prepare_pt2e, calibration, convert_pt2e"),  # quantize='int8' only
        Step(4, "bound dims", "bound dynamic dims (memory budget)"),  # hfexport's own: _bounds.py, _memory_plan.py
        Step(5, "lower", "to_edge_transform_and_lower"),
        Step(5, "emit", "to_executorch"),
        Step(5, "open", "executorch runtime: Program.load_method"),
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.variant is not None and "variant" in vars(cls):  # the scopes a variant's exports activate
            cls.scopes = (*ExecutorchExporter.scopes, f"executorch.{cls.variant}", f"executorch.{cls.variant}.internals")
            cls.preset_options = {"backend": cls.variant}  # ExecutorchConfig.backend: the kernel presets it

    def new_state(self, ctx: ExportContext) -> ExecutorchState:
        return ExecutorchState()

    def variant_scopes(self, variant: str) -> tuple[str, ...]:
        """The scopes of torch patches, program fixes and node fixes for ``variant``."""
        return ("executorch", f"executorch.{variant}")

    def prepare(self, ctx: ExportContext) -> None:
        """Stages 1-3: the variant's device, dtype and partitioners; the patches capture and lowering run under."""
        state, config = executorch_state(ctx), executorch_config(ctx)
        ctx.stack.callback(state.held.close)  # on failure; lower closes them itself
        state.held.enter_context(without_lowering_notices())  # through capture and lowering (_quiet.py says which)
        state.held.enter_context(cia_ops_collected_once())  # torch's walk of its CIA ops once per export, not 17 times
        scopes = self.variant_scopes(config.backend)
        with ctx.stage(1):
            prepare = variant_registration(config.backend)
            if is_disabled(prepare, config.disable):
                # Consistent with the workarounds: a disabled preparation is left out entirely. The model is traced
                # where and as it is, and no partitioner runs (every op on portable kernels).
                ctx.note(f"{prepare.name} disabled: no device/dtype move and no partitioner (portable kernels only)")
                state.preparation = BackendPreparation()
            else:
                state.preparation = BackendPreparation.of(prepare.func(ctx))
        quantize_source(ctx)  # step quantize weights (quantize='8da4w'): the traced model is a quantized copy
        with ctx.stage(2):
            ctx.install_patches(scopes)
        with ctx.stage(3):
            ctx.install_patches(("executorch.internals", f"executorch.{config.backend}.internals"))

    def lower(self, ctx: ExportContext) -> None:
        """Stages 4-5 and the steps between them, top to bottom: the captured program to a loaded ``.pte``."""
        state, config = executorch_state(ctx), executorch_config(ctx)
        scopes = self.variant_scopes(config.backend)
        refuse_while_loop(ctx.program, self.name)  # before the lowering that the emitter would fail at its end
        quantize_program(ctx)  # step quantize (quantize='int8'): PT2E on the captured program, captured again
        with ctx.stage(4):
            ctx.apply_fx_program_fixes(ctx.program, scopes)
        # ExecuTorch plans memory at each dynamic dim's upper bound (an unbounded one at its trace size: a larger
        # input then fails at run time), so every dim gets a finite bound from its role (_bounds.py), and default
        # bounds are halved while the estimated plan exceeds memory_budget_gib (_memory_plan.py)
        with ctx.step("bound dynamic dims (memory budget)"):
            bounds = state.dim_bounds = bound_dynamic_dims(ctx.program, ctx)
            fit_memory_budget(ctx.program, ctx, bounds)
        if bounds.bounded:
            ctx.note("dynamic dims given a finite upper bound: " + ", ".join(
                f"{sym} in [{lo}, {hi}]" for sym, (lo, hi) in sorted(bounds.bounded.items())))
        with ctx.stage(5):
            ctx.apply_fx_node_fixes(ctx.program.graph_module, scopes)
        preparation = state.preparation
        (edge, manager, planning, delegation), planned = lower_within_budget(  # steps lower, emit
            ctx, ctx.program, bounds, lambda: lower_program(ctx, preparation.partitioners, ctx.step),
            lambda lowered: planned_memory_bytes(lowered[1]))
        dtypes, write = input_dtypes(ctx.inputs), program_writer(manager)
        mutations = input_mutations(manager.exported_program())
        del edge, manager  # the lowered programs and their weights' bytes go before the runtime loads the file
        with ctx.step("executorch runtime: Program.load_method"):
            runner = state.runner = ExecutorchRunner.from_writer(write, input_dtypes=dtypes,
                                                                 input_mutations=mutations)
        state.manifest = {
            "program_file": PROGRAM_FILE, "data_file": runner.data_file, "variant": config.backend,
            "partitioners": [type(p).__name__ for p in preparation.partitioners], **delegation.as_manifest(),
            "non_core_aten_on_portable_kernels": sorted(set(state.admitted_ops)),
            "initialized_mutable_buffers": sorted(set(state.initialized_buffers)),
            "memory_planning": planning, "planned_memory_bytes": planned, "memory_budget": bounds.budget,
            "dim_upper_bound": config.dim_upper_bound or DEFAULT_DIM_UPPER_BOUND,
            "max_batch": bounds.roles.get("batch", {}).get("max", config.max_batch or DEFAULT_MAX_BATCH),
            "max_seq_len": config.max_seq_len, "dim_bounds": bounds.roles,
            "bounded_dims": {sym: list(rng) for sym, rng in sorted(bounds.bounded.items())},
            "input_dtypes": dtypes, "input_mutations": mutations, "device": preparation.device,
        }
        report_planned_memory(ctx, planned, bounds)
        if preparation.partitioners:
            delegation.note(ctx)
        state.held.close()  # what prepare entered for capture and lowering

    def diagnose_mismatch(self, ctx: ExportContext, exported: ExportedModel, inputs: Any,
                          report: Any) -> dict[str, Any] | None:
        """The delegated partition (and op) that makes the program differ from eager, found by lowering the program
        again with partitions left on portable kernels (``_bisect.py``); None when nothing was delegated."""
        preparation, variant = executorch_state(ctx).preparation, executorch_config(ctx).backend
        if not preparation.partitioners or ctx.program is None:
            return None
        return bisect_delegates(ctx, exported, inputs, report, preparation.partitioners, lower_program,
                                scopes=(*self.variant_scopes(variant), "executorch.internals",
                                        f"executorch.{variant}.internals"))

    # ── packaging and loading ─────────────────────────────────────────────────────────────────────────
    def package(self, ctx: ExportContext) -> ExportedModel:
        state = executorch_state(ctx)
        runner = state.runner
        if runner is None:
            raise RuntimeError("package() runs after lower(), which opens the runner")
        return self.artifact(ctx, [Component(
            "model", runner, out_spec=ctx.program.call_spec.out_spec, write=runner.write_files,
            manifest={"program_file": PROGRAM_FILE, "executorch": state.manifest,
                      **quantization_section(state.quantization, runner)})])

    def check_inputs(self, inputs: Any, model: Any = None) -> None:
        """The kernel's checks, then ``quantize``'s: a model quantized already, or calibration inputs that do not
        match the export's, are refused before any work."""
        super().check_inputs(inputs, model)
        config = self.config
        if not isinstance(config, ExecutorchConfig):
            raise TypeError(f"an ExecutorchExporter's config is an ExecutorchConfig, got {type(config).__name__}")
        if config.quantize is not None:
            check_quantization_inputs(config.quantize, inputs, model, backend=self.name,
                                      static_shapes=not config.dynamic and not config.dynamic_shapes)

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = "model", *,
                    trust_remote_code: bool = False) -> ExecutorchRunner:
        """Open a saved component's ``model.pte`` (and its ``.ptd`` data file, if any) on the ExecuTorch runtime.

        A ``.pte`` is a flatbuffer of operator calls and weights, read first by ``check_pte`` (strings the runtime
        prints, XNNPACK ids, dims and constant sizes, planned memory). A delegate other than XNNPACK is refused
        unless ``trust_remote_code=True``: ``CudaBackend`` loads an AOTInductor shared library stored in the
        artifact.
        """
        require_executorch()
        section = component_manifest(manifest, component)
        executorch = section.get("executorch", {})
        if section.get("quantization"):
            register_quantized_kernels()
        where = f"components[{component!r}]"
        name = executorch.get("program_file", section.get("program_file"))
        program = artifact_file(path, manifest, name, f"{where}.executorch.program_file")
        data = executorch.get("data_file")
        data_path = artifact_file(path, manifest, data, f"{where}.executorch.data_file") if data is not None else None
        checked = artifact_bytes(path, manifest, name, f"{where}.executorch.program_file")  # read once, checked
        # the .ptd: hashed from a descriptor kept open, which the runtime (it takes a path) reopens by /proc/self/fd
        data_fd = artifact_descriptor(path, manifest, data, f"{where}.executorch.data_file") if data else None
        return ExecutorchRunner(program, data_path=data_path, input_dtypes=executorch.get("input_dtypes"),
                                input_mutations=executorch.get("input_mutations", ()),
                                untrusted="trusted" if trust_remote_code else True, program_bytes=checked,
                                data_fd=data_fd)  # the runner owns the descriptor, and closes it

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        text = f"{type(exc).__name__}: {exc}"
        if "finite upper bound" in text or "bounded tensor" in text:
            return ["give the dynamic dims explicit bounds: dynamic_shapes={'input_ids': {1: Dim('seq', max=...)}}, "
                    "or raise ExecutorchConfig(dim_upper_bound=...)"]
        if "not in Core ATen opset" in text or "no kernel in the ExecuTorch portable library" in text:
            return ["add a decomposition for the op (see _patch_default_decomposition_table in "
                    "hfexport_executorch/workarounds/executorch_patches.py), or an @register_patch('executorch', "
                    "...) that avoids it", "see the full traceback above (the original error is chained)"]
        if "CUDA" in text or "GPU" in text:
            return ["run on a machine with a visible NVIDIA GPU, or export with backend='executorch-xnnpack' (CPU)"]
        return []


def lower_program(ctx: ExportContext, partitioners: list[Any],
                  step: Any = None) -> tuple[Any, Any, dict[str, Any], Any]:
    """``to_edge_transform_and_lower`` of ``ctx.program`` with ``partitioners``, then ``to_executorch`` with the
    config's memory planning: ``(edge manager, program manager, planning options, delegation report)``. ``step``
    (``ctx.step``) times and reports the two toolchain calls; the diagnosis lowers again without it."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    config, preparation = executorch_config(ctx), executorch_state(ctx).preparation
    timed = step or (lambda name: contextlib.nullcontext())
    # no_grad: the program is inference-only, but its parameters' example values require grad, so that ExecuTorch's
    # passes, which re-run each node on them, would dispatch a higher-order op through autograd: ``scan`` (Mamba's
    # selective scan, hfexport_dynamo._recurrences) then traces its forward for a backward and keeps the SymInt
    # sizes it saves as outputs, which its fake implementation refuses ("Expected leaf to be a Tensor or None,
    # got <class 'torch.SymInt'>")
    # a weight that a delegate and a portable kernel both read (a tied LM head) is stored once, in model.ptd
    weights = external_weights(ctx.program) if config.backend == "xnnpack" and partitioners \
        and shares_weights_with_portable_kernels(ctx.program) else False
    # a decoder with ExecuTorch's LLM runner's inputs carries the constant methods the runner reads (get_max_seq_len,
    # get_eos_ids, ...: hfexport_dynamo.tasks.llm_runner.LLMRunnerStep.llm_metadata)
    metadata = getattr(ctx.model, "llm_metadata", None)
    # the weights' bytes that XNNPACK's preprocess serializes go to temporary files as it adds them (_weights.py)
    spilled = named_data_on_disk if config.backend == "xnnpack" else contextlib.nullcontext
    with timed("to_edge_transform_and_lower"), torch.no_grad(), spilled():
        edge = to_edge_transform_and_lower(ctx.program, transform_passes=list(preparation.transform_passes),
                                           partitioner=list(partitioners) or None,
                                           constant_methods=dict(metadata) if metadata else None,
                                           compile_config=EdgeCompileConfig(**preparation.edge_compile_options))
    delegation = delegation_report(edge)  # before to_executorch, which rewrites the edge graph in place
    delegation.check_kernels()
    planning = {"alloc_graph_input": config.alloc_graph_input, "alloc_graph_output": config.alloc_graph_output,
                "alloc_mutable_buffers": config.alloc_mutable_buffers, **preparation.memory_planning_options}
    # A program that writes into its buffers with index_put (a KV cache of fixed capacity) writes in place:
    # ExecuTorch's re-inplace pass turns the functional index_put on a mutable buffer back into index_put_
    # (without it, each call copies the whole buffer twice: into index_put's output, then back)
    backend_options = {"run_reinplace_pass": all(map(index_puts_reinplaceable,
                                                     (edge.exported_program(n) for n in edge.methods))),
                       "external_constants": weights, **preparation.backend_config_options}
    # no_grad: the passes after the re-inplace pass run index_put_ on the buffer's example value, which autograd
    # refuses for a leaf that requires grad ("a leaf Variable that requires grad is being used in an in-place
    # operation"); the program is inference-only
    with timed("to_executorch"), torch.no_grad(), spilled():
        manager = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(**planning),
                                                             **backend_options))
    release_lowered_modules(edge)  # serialized: the lowered modules' weights go (torch's fake-tensor cache keeps them)
    return edge, manager, planning, delegation


class XnnpackExporter(ExecutorchExporter):
    """``executorch-xnnpack``: CPU, float32, XNNPACK delegate; the rest on portable kernels."""

    name: ClassVar[str] = "executorch-xnnpack"
    variant: ClassVar[str | None] = "xnnpack"
    # Peak RSS / weight bytes of a text-generation export of the seeded 0.5 B Qwen2 (1,976 MB of fp32 weights):
    # fp32 6,195-6,199 MiB, 3.29x (benchmarks/results/bench_export_memory_executorch.txt, 2026-12-08: weights spilled
    # while lowering; 8,078 MiB, 4.29x, before; 8,213 in bench_generation_0.5b.txt run 3); artifact 1.00x.
    export_peak_ratio: ClassVar[dict[str | None, float]] = {None: 3.4}
    # generation programs attend with ExecuTorch's LLM kernels over the filled cache positions (_attention.py)
    needs: ClassVar[RuntimeNeeds] = RuntimeNeeds(cache_layout="in_place", attention="llama::custom_sdpa")


class CudaExporter(ExecutorchExporter):
    """``executorch-cuda``: bfloat16, AOTInductor CUDA delegate; needs a visible NVIDIA GPU at export time."""

    name: ClassVar[str] = "executorch-cuda"
    variant: ClassVar[str | None] = "cuda"
    # The export's verification compares the bfloat16 program with the float32 model: bfloat16 keeps 8
    # significant bits (a relative spacing of 2**-8, about 4e-3, at each rounding) and the error compounds over
    # layers, so 5e-2 / 5e-2, of the order of transformers' own bfloat16-against-float32 tests. Not measured on this
    # project's CI (no GPU): tighten it with numbers from a GPU run.
    verify_atol: ClassVar[float] = 5e-2
    verify_rtol: ClassVar[float] = 5e-2


# ── Stage 1: Backend preparation ──
# The variants' definitions, registered as kind executorch_variant (a vendor's variant registers the same way).
@register_backend_prepare("xnnpack")
def prepare_for_xnnpack(ctx: ExportContext) -> BackendPreparation:
    """CPU, float32, contiguous inputs and one ``XnnpackPartitioner``; ops it does not take stay on portable kernels.

    **Why**: XNNPACK's partitioner and serializer need a CPU graph, and ExecuTorch's spec propagation rejects a 0
    stride (an expanded input).
    **Upstream**: n/a (the documented XNNPACK lowering recipe).
    **Remove when**: never: the variant's definition (disabled: no move, no partitioner, portable kernels only).
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.passes.cse_pass import CSEPass

    place_model_and_inputs(ctx, "cpu", torch.float32)
    return BackendPreparation([XnnpackPartitioner()], decompositions=XNNPACK_DECOMPOSITIONS,
                              transform_passes=[CSEPass()], dtype=torch.float32)


@register_backend_prepare("cuda")
def prepare_for_cuda(ctx: ExportContext) -> BackendPreparation:
    """bfloat16 and a ``CudaPartitioner`` (AOTInductor), weights in a ``.ptd``; refused early without a visible GPU.

    **Why**: ExecuTorch's CUDA backend (experimental in 1.5.1) runs bfloat16 in one AOTI delegate compiled on the GPU
    at export (else ``Found no NVIDIA driver``, late); options as in its examples. Unverified on this project's CI (no
    GPU).
    **Upstream**: n/a (ExecuTorch's CUDA lowering recipe, ``examples/models/*/export_*.py``).
    **Remove when**: never: the variant's definition.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("backend 'executorch-cuda' needs a visible NVIDIA GPU (torch.cuda.is_available() is "
                           "False): AOTInductor compiles the CUDA kernels at export time. Export on a GPU machine, "
                           "or use backend='executorch-xnnpack' for CPU")
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

    place_model_and_inputs(ctx, "cuda", torch.bfloat16)
    specs = [CudaBackend.generate_method_name_compile_spec("forward")]
    return BackendPreparation([CudaPartitioner(specs)],
                              edge_compile_options={"_check_ir_validity": False, "_skip_dim_order": True},
                              memory_planning_options={"alloc_graph_input": False},
                              device="cuda", dtype=torch.bfloat16)


# ── Stage 2: Torch patches ──
# Registered in workarounds/torch_patches.py (scope "executorch").

# ── Stage 3: ExecuTorch patches ──
# Registered in workarounds/executorch_patches.py ("executorch.internals") and workarounds/xnnpack_patches.py
# ("executorch.xnnpack.internals"; and "executorch.quantization", which quantize="int8" installs in its step).

# ── Stage 4: FX program fixes ──
# None registered by hfexport: the dim bounds and the memory budget are the step after this stage (lower()).

# ── Stage 5: FX node fixes ──
# Registered in workarounds/node_fixes.py ("executorch", and "executorch.xnnpack").
