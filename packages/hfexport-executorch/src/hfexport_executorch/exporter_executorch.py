"""ExecutorchExporter: the dynamo pipeline, then ``to_edge_transform_and_lower`` + ``to_executorch`` to ``model.pte``.

Five stages around ExecuTorch's lowering (the dynamo pipeline runs nested inside stage 4):

1. Backend preparation — ``prepare_for_<variant>`` in ``_BACKEND_PREPARE`` (``xnnpack``, ``cuda``; vendors add
   theirs with ``@register_backend_prepare("<variant>")``): device, dtype, contiguous inputs, partitioners.
   The model is restored when the export ends.
2. Torch patches — ``@register_patch("executorch", ...)`` and ``@register_patch("executorch.<variant>", ...)``
   for torch ops the ExecuTorch backends do not accept; active while tracing and lowering.
3. ExecuTorch patches — ``@register_patch("executorch.internals", ...)``: ExecuTorch internals that crash on
   valid dynamic-shape graphs (same registry, another scope, so stage 2 does not install them).
4. FX program fixes — trace with the dynamo pipeline, then ``@register_fx_program_fix("executorch")``
   (finite bounds for unbounded dynamic dims, the non-Core-ATen ops that have portable kernels).
5. FX node fixes — ``@register_fx_node_fix("executorch")`` (Python sym ops ExecuTorch cannot emit, ``pow`` as a
   ``mul`` chain, ...), then ``to_edge_transform_and_lower`` and ``to_executorch``.

Every workaround (``_patch_*``, ``_fix_*``) and every preparation (``prepare_for_*``) can be left out by name
with ``disable=("<function name>",)``; ``grep -nE "^def (_patch_|_fix_|prepare_for_)"`` lists them, and each
docstring says **Why**, **Upstream** and **Remove when**.

executorch itself is imported lazily (inside the stages and the runner), so that importing this module, listing
backends and ``hfexport --help`` stay fast, and a missing install is reported by name.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import operator
import shutil
import sys
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from hfexport import (
    ExportConfig,
    ExportContext,
    ExportedModel,
    Stage,
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    patch_context,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
    workarounds_for,
)
from hfexport_dynamo._pytree import register_transformers_pytrees
from hfexport_dynamo.exporter_dynamo import DynamoConfig, DynamoExporter

__all__ = [
    "BackendPreparation",
    "CudaExporter",
    "DEFAULT_DIM_UPPER_BOUND",
    "DelegationReport",
    "ExecutorchConfig",
    "ExecutorchExporter",
    "ExecutorchRunner",
    "PROGRAM_FILE",
    "XnnpackExporter",
    "backend_variants",
    "delegation_report",
    "place_model_and_inputs",
    "portable_kernel_names",
    "register_backend_prepare",
]

logger = logging.getLogger("hfexport")
aten = torch.ops.aten

PROGRAM_FILE = "model.pte"
DATA_FILE_SUFFIX = ".ptd"
# The largest size given to a dynamic dimension that torch.export left unbounded (``Dim.AUTO``, ``Dim.DYNAMIC``).
# ExecuTorch plans memory for the upper bound of every dynamic dim, so planned activations grow with the product
# of the bounds (attention scores with batch * seq * seq), and the runtime allocates that memory when it loads the
# program: all-MiniLM-L6-v2 with dynamic=True (seq <= 512 inferred by torch.export, batch bounded here) plans
# 1.4 GiB at 32, 2.8 GiB at 64, 5.5 GiB at 128. Set ``ExecutorchConfig(dim_upper_bound=...)`` or give explicit
# ``Dim(name, max=...)`` bounds for other inputs.
DEFAULT_DIM_UPPER_BOUND = 64
# Planned memory above this gets a note in the manifest and a warning that says how to lower it.
PLANNED_MEMORY_WARNING_BYTES = 1 << 30


def _require_executorch() -> None:
    """Raise an ImportError that names what to install when executorch is missing."""
    import importlib.util

    if importlib.util.find_spec("executorch") is None:
        raise ImportError("the ExecuTorch backends need executorch: pip install executorch "
                          "(or pip install hfexport-executorch, which brings it)")


# ── Backend variants ───────────────────────────────────────────────────────────────────────────────────
@dataclass
class BackendPreparation:
    """What a ``prepare_for_<variant>`` function returns (a plain list of partitioners is short for this).

    Attributes:
        partitioners: passed to ``to_edge_transform_and_lower``; empty: every op runs on portable kernels.
        edge_compile_options: extra ``EdgeCompileConfig`` fields for this variant.
        memory_planning_options: ``MemoryPlanningPass`` arguments that override the config's ``alloc_*`` flags.
        backend_config_options: extra ``ExecutorchBackendConfig`` fields.
        device: the device the model is traced on (recorded in the manifest).
        dtype: the floating dtype the program was traced in (float inputs are cast to it when run).
    """

    partitioners: list[Any] = field(default_factory=list)
    edge_compile_options: dict[str, Any] = field(default_factory=dict)
    memory_planning_options: dict[str, Any] = field(default_factory=dict)
    backend_config_options: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    dtype: torch.dtype | None = None


PrepareFunction = Callable[[ExportContext], "BackendPreparation | list[Any]"]
_BACKEND_PREPARE: dict[str, PrepareFunction] = {}


def register_backend_prepare(variant: str) -> Callable[[PrepareFunction], PrepareFunction]:
    """Register ``prepare_for_<variant>(ctx) -> BackendPreparation | list[partitioner]`` as an ExecuTorch variant.

    The function moves the model and inputs to the variant's device and dtype (use
    :func:`place_model_and_inputs`, which restores the model after the export) and returns the partitioners.
    The variant is then valid as ``ExecutorchConfig(backend=variant)``, and its workarounds are registered under
    the scope ``"executorch.<variant>"``. A vendor distribution ships an exporter subclass with ``variant`` set and
    declares it under the ``hfexport.backends`` entry points (see the test plugin ``hfexport-etportable``).

    Raises:
        ValueError: ``variant`` is not an identifier, or is registered already by another function.
    """
    if not isinstance(variant, str) or not variant.isidentifier():
        raise ValueError(f"an ExecuTorch variant is an identifier such as 'xnnpack', got {variant!r}")

    def decorator(prepare: PrepareFunction) -> PrepareFunction:
        current = _BACKEND_PREPARE.get(variant)
        if current is not None and _qualname(current) != _qualname(prepare):
            raise ValueError(f"ExecuTorch variant {variant!r} is registered already by {_qualname(current)}")
        _BACKEND_PREPARE[variant] = prepare
        return prepare

    return decorator


def _qualname(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"


def _load_variant_plugins() -> None:
    """Import the exporters of installed ``executorch-*`` backends, so that their variants register themselves."""
    from hfexport import list_backends

    for info in list_backends():
        if (info.name.startswith("executorch") and info.status == "ok" and info.backend is not None
                and not info.backend.exporter.startswith(f"{__name__}:")):
            try:
                info.backend.load_exporter()
            except Exception as exc:  # a broken plugin must not hide the others: say so and go on
                logger.warning("ExecuTorch variant plugin %s (%s) failed to load: %s", info.name, info.value, exc)


def backend_variants(load_plugins: bool = True) -> list[str]:
    """The registered ExecuTorch variants (``xnnpack``, ``cuda``, and those of installed plugins), sorted."""
    if load_plugins:
        _load_variant_plugins()
    return sorted(_BACKEND_PREPARE)


# ── Config ─────────────────────────────────────────────────────────────────────────────────────────────
@dataclass
class ExecutorchConfig(DynamoConfig):
    """Options of the ExecuTorch backends.

    Attributes:
        backend: the variant: ``"xnnpack"`` (CPU, float32, XNNPACK delegate), ``"cuda"`` (bfloat16, AOTInductor,
            needs a GPU) or one registered with :func:`register_backend_prepare`.
        alloc_graph_input: plan memory for graph inputs (the runtime copies inputs in). ``False`` only with a
            C++ caller that binds its own input buffers; the Python runtime needs ``True``.
        alloc_graph_output: plan memory for graph outputs. ``False`` only when the caller binds output buffers
            (``Method::set_output_data_ptr``).
        alloc_mutable_buffers: plan memory for buffers the graph mutates (KV caches held by the model).
        dim_upper_bound: the inclusive upper bound given to every dynamic dimension torch.export left
            unbounded (``dynamic=True``). ExecuTorch plans memory for it: activations grow with the product of
            the bounds. Explicit ``Dim(name, max=...)`` bounds in ``dynamic_shapes`` are kept.
    """

    backend: str = "xnnpack"
    alloc_graph_input: bool = True
    alloc_graph_output: bool = True
    alloc_mutable_buffers: bool = True
    dim_upper_bound: int = DEFAULT_DIM_UPPER_BOUND

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in _BACKEND_PREPARE:
            variants = backend_variants(load_plugins=True)
            if self.backend not in _BACKEND_PREPARE:
                raise ValueError(f"unknown ExecuTorch variant backend={self.backend!r}; registered variants: "
                                 f"{', '.join(map(repr, variants))} (vendors add one with "
                                 "hfexport_executorch.exporter_executorch.register_backend_prepare)")
        for name in ("alloc_graph_input", "alloc_graph_output", "alloc_mutable_buffers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.dim_upper_bound, bool) or not isinstance(self.dim_upper_bound, int) \
                or self.dim_upper_bound < 2:
            raise ValueError(f"dim_upper_bound must be an int >= 2 (the largest size of a dynamic dimension), "
                             f"got {self.dim_upper_bound!r}")


# ── per-export state for the program fixes (they take only the program) ───────────────────────────────
@dataclass
class _ExportState:
    dim_upper_bound: int = DEFAULT_DIM_UPPER_BOUND
    admitted_ops: list[str] = field(default_factory=list)
    bounded: dict[str, tuple[int, int]] = field(default_factory=dict)


_STATE: contextvars.ContextVar[_ExportState | None] = contextvars.ContextVar("hfexport_executorch_state",
                                                                             default=None)


def _state() -> _ExportState:
    state = _STATE.get()
    return state if state is not None else _ExportState()


class ExecutorchExporter(DynamoExporter):
    """Export to an ExecuTorch program (``model.pte``), verified on the ExecuTorch runtime.

    ``variant`` presets the ExecuTorch variant (``XnnpackExporter``, ``CudaExporter``, a vendor's subclass); the
    generic exporter takes it from ``ExecutorchConfig.backend``.
    """

    name: ClassVar[str] = "executorch"
    variant: ClassVar[str | None] = None
    config_class: ClassVar[type[ExportConfig]] = ExecutorchConfig
    scopes: ClassVar[tuple[str, ...]] = ("dynamo", "executorch", "executorch.internals")
    toolchain: ClassVar[tuple[str, ...]] = (*DynamoExporter.toolchain, "executorch", "hfexport-executorch")
    tested_versions: ClassVar[dict[str, str]] = {**DynamoExporter.tested_versions, "executorch": "1.5.1"}
    stages: ClassVar[tuple[Stage, ...]] = (
        Stage(1, "Backend preparation", '@register_backend_prepare("<variant>")', "stage_backend_preparation"),
        Stage(2, "Torch patches", '@register_patch("executorch", ...)', "stage_torch_patches"),
        Stage(3, "ExecuTorch patches", '@register_patch("executorch.internals", ...)', "stage_executorch_patches"),
        Stage(4, "FX program fixes", '@register_fx_program_fix("executorch")', "stage_fx_program_fixes",
              runs="torch.export.export"),
        Stage(5, "FX node fixes", '@register_fx_node_fix("executorch")', "stage_fx_node_fixes",
              runs="to_edge_transform_and_lower, to_executorch"),
    )

    def __init__(self, config: ExportConfig | None = None, **options: Any):
        _require_executorch()
        if self.variant is not None:
            requested = options.get("backend", config.backend if isinstance(config, ExecutorchConfig) else None)
            if config is None and "backend" not in options:
                options["backend"] = self.variant
            elif requested != self.variant:
                raise ValueError(f"backend {self.name!r} exports the {self.variant!r} variant, but backend="
                                 f"{requested!r} was given: use backend='executorch-{requested}' (or pass "
                                 f"backend={self.variant!r})")
        super().__init__(config, **options)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.variant is not None and "variant" in vars(cls):  # the scopes a variant's exports activate
            cls.scopes = (*ExecutorchExporter.scopes, f"executorch.{cls.variant}", f"executorch.{cls.variant}.internals")

    def variant_scopes(self, variant: str) -> tuple[str, ...]:
        """The scopes of torch patches, program fixes and node fixes for ``variant``."""
        return ("executorch", f"executorch.{variant}")

# ── Stage 1: Backend preparation ──
    def stage_backend_preparation(self, ctx: ExportContext) -> None:
        config: ExecutorchConfig = ctx.config  # type: ignore[assignment]
        state = _ExportState(dim_upper_bound=config.dim_upper_bound)  # read by the workarounds of stages 3-5
        ctx.stack.callback(_STATE.reset, _STATE.set(state))
        ctx.extras["executorch_state"] = state
        prepare = _BACKEND_PREPARE[config.backend]
        if _disabled(prepare, config.disable):
            # Consistent with the workarounds: a disabled preparation is left out entirely. The model is traced
            # where and as it is, and no partitioner runs (every op on portable kernels).
            ctx.note(f"{prepare.__name__} disabled: no device/dtype move and no partitioner (portable kernels only)")
            preparation = BackendPreparation()
        else:
            result = prepare(ctx)
            preparation = result if isinstance(result, BackendPreparation) else BackendPreparation(list(result or []))
        ctx.extras["executorch_preparation"] = preparation

# ── Stage 2: Torch patches ──
    def stage_torch_patches(self, ctx: ExportContext) -> None:
        scopes = self.variant_scopes(ctx.config.backend)  # type: ignore[attr-defined]
        _record_patches(ctx, ctx.stack.enter_context(patch_context(scopes, ctx.config.disable)))

# ── Stage 3: ExecuTorch patches ──
    def stage_executorch_patches(self, ctx: ExportContext) -> None:
        variant = ctx.config.backend  # type: ignore[attr-defined]
        scopes = ("executorch.internals", f"executorch.{variant}.internals")
        _record_patches(ctx, ctx.stack.enter_context(patch_context(scopes, ctx.config.disable)))

# ── Stage 4: FX program fixes ──
    def stage_fx_program_fixes(self, ctx: ExportContext) -> None:
        config: ExecutorchConfig = ctx.config  # type: ignore[assignment]
        state: _ExportState = ctx.extras["executorch_state"]
        program = self.trace(ctx)
        fixes = workarounds_for("fx_program_fix", self.variant_scopes(config.backend), config.disable)
        ctx.report["fixes"].update(apply_fx_program_fixes(program, fixes).applied)
        if state.bounded:
            ctx.note("unbounded dynamic dims given a finite upper bound (dim_upper_bound): " + ", ".join(
                f"{sym} in [{lo}, {hi}]" for sym, (lo, hi) in sorted(state.bounded.items())))

# ── Stage 5: FX node fixes ──
    def stage_fx_node_fixes(self, ctx: ExportContext) -> None:
        from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.passes import MemoryPlanningPass

        config: ExecutorchConfig = ctx.config  # type: ignore[assignment]
        program = ctx.program
        fixes = workarounds_for("fx_node_fix", self.variant_scopes(config.backend), config.disable)
        ctx.report["fixes"].update(apply_fx_node_fixes(program.graph_module, fixes).applied)

        preparation: BackendPreparation = ctx.extras["executorch_preparation"]
        state: _ExportState = ctx.extras["executorch_state"]
        compile_options = dict(preparation.edge_compile_options)
        edge = to_edge_transform_and_lower(program, partitioner=list(preparation.partitioners) or None,
                                           compile_config=EdgeCompileConfig(**compile_options))
        report = delegation_report(edge)  # before to_executorch, which rewrites the edge graph in place
        if report.missing_kernels:
            raise RuntimeError(f"ops left outside every delegate have no kernel in the ExecuTorch portable library: "
                               f"{', '.join(report.missing_kernels)}; the program would fail at load with "
                               "'Missing operator'")
        planning = {"alloc_graph_input": config.alloc_graph_input, "alloc_graph_output": config.alloc_graph_output,
                    "alloc_mutable_buffers": config.alloc_mutable_buffers, **preparation.memory_planning_options}
        manager = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(**planning),
                                                             **preparation.backend_config_options))
        input_dtypes = _input_dtypes(program)
        plans = manager.executorch_program.execution_plan
        planned = sum(sum(plan.non_const_buffer_sizes[1:]) for plan in plans)  # [0] is reserved by ExecuTorch
        runner = ExecutorchRunner.from_program_manager(manager, input_dtypes=input_dtypes)
        ctx.extras["executorch_runner"] = runner
        ctx.extras["executorch_manifest"] = {
            "program_file": PROGRAM_FILE,
            "data_file": runner.data_file,
            "variant": config.backend,
            "partitioners": [type(p).__name__ for p in preparation.partitioners],
            "delegated_fraction": round(report.fraction, 4),
            "delegated_nodes": report.delegated_nodes,
            "portable_nodes": report.portable_nodes,
            "delegates": report.num_delegates,
            "portable_ops": dict(report.portable_ops.most_common()),
            "non_core_aten_on_portable_kernels": sorted(set(state.admitted_ops)),
            "memory_planning": planning,
            "planned_memory_bytes": planned,
            "dim_upper_bound": config.dim_upper_bound,
            "bounded_dims": {sym: list(rng) for sym, rng in sorted(state.bounded.items())},
            "input_dtypes": input_dtypes,
            "device": preparation.device,
        }
        if planned > PLANNED_MEMORY_WARNING_BYTES and state.bounded:
            message = (f"ExecuTorch plans {planned / 2**30:.1f} GiB for the upper bounds of the dynamic dims "
                       f"({', '.join(f'{k} <= {v[1]}' for k, v in sorted(state.bounded.items()))} from "
                       f"dim_upper_bound={config.dim_upper_bound}); the runtime allocates it when it loads the program. "
                       "Lower dim_upper_bound or give explicit Dim(name, max=...) bounds in dynamic_shapes")
            logger.warning(message)
            ctx.note(message)
        if report.portable_ops and preparation.partitioners:
            ctx.note(f"{report.portable_nodes} of {report.portable_nodes + report.delegated_nodes} compute nodes "
                     f"run on portable kernels: {', '.join(report.portable_ops)}")

    # ── packaging ─────────────────────────────────────────────────────────────────────────────────────
    def package(self, ctx: ExportContext) -> ExportedModel:
        runner: ExecutorchRunner = ctx.extras["executorch_runner"]
        manifest = self.manifest(ctx, program_file=PROGRAM_FILE, executorch=ctx.extras["executorch_manifest"])
        components = {PROGRAM_FILE: runner.write_files, **self.components(ctx)}
        return ExportedModel(self.name, runner, manifest, components=components,
                             out_spec=ctx.program.call_spec.out_spec, reference=self.reference(ctx))

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any]) -> ExecutorchRunner:
        """Open the saved ``model.pte`` (and its ``.ptd`` data file, if any) on the ExecuTorch runtime."""
        _require_executorch()
        register_transformers_pytrees()
        section = manifest.get("executorch", {})
        path = Path(path)
        data = section.get("data_file")
        return ExecutorchRunner(path / section.get("program_file", manifest.get("program_file", PROGRAM_FILE)),
                                data_path=path / data if data else None, input_dtypes=section.get("input_dtypes"))

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        text = f"{type(exc).__name__}: {exc}"
        if "finite upper bound" in text or "bounded tensor" in text:
            return ["give the dynamic dims explicit bounds: dynamic_shapes={'input_ids': {1: Dim('seq', max=...)}}, "
                    "or raise ExecutorchConfig(dim_upper_bound=...)"]
        if "not in Core ATen opset" in text or "no kernel in the ExecuTorch portable library" in text:
            return ["add a decomposition for the op (see _patch_default_decomposition_table in "
                    "hfexport_executorch/exporter_executorch.py), or an @register_patch('executorch', ...) that "
                    "avoids it", "see the full traceback above (the original error is chained)"]
        if "CUDA" in text or "GPU" in text:
            return ["run on a machine with a visible NVIDIA GPU, or export with backend='executorch-xnnpack' (CPU)"]
        return super().hints_for(stage, exc)


class XnnpackExporter(ExecutorchExporter):
    """``executorch-xnnpack``: CPU, float32, XNNPACK delegate; the rest on portable kernels."""

    name: ClassVar[str] = "executorch-xnnpack"
    variant: ClassVar[str | None] = "xnnpack"


class CudaExporter(ExecutorchExporter):
    """``executorch-cuda``: bfloat16, AOTInductor CUDA delegate; needs a visible NVIDIA GPU at export time."""

    name: ClassVar[str] = "executorch-cuda"
    variant: ClassVar[str | None] = "cuda"


def _record_patches(ctx: ExportContext, report: Any) -> None:
    ctx.report["patches"].extend(r.as_dict() | {"path": p} for r, p in report.installed)
    ctx.report["skipped_patches"].extend(r.as_dict() | {"path": p, "reason": why} for r, p, why in report.skipped)


def _disabled(func: Callable[..., Any], disabled: Iterable[str]) -> bool:
    off = set(disabled)
    return func.__name__ in off or _qualname(func) in off


def _input_dtypes(program: torch.export.ExportedProgram) -> list[str | None]:
    """The dtype of every user-input leaf of ``program`` (``None`` for non-tensor leaves)."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out: list[str | None] = []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name != "USER_INPUT":
            continue
        val = placeholders[spec.arg.name].meta.get("val") if hasattr(spec.arg, "name") else None
        out.append(str(val.dtype).replace("torch.", "") if isinstance(val, torch.Tensor) else None)
    return out


# ── the runner ─────────────────────────────────────────────────────────────────────────────────────────
class ExecutorchRunner:
    """Runs ``model.pte`` on the ExecuTorch runtime (``executorch.runtime``): flat input leaves in, flat outputs out.

    Args:
        path: the ``.pte`` file.
        data_path: the ``.ptd`` file holding the weights, for variants that keep them outside the program (CUDA).
        input_dtypes: the dtype of each input leaf (float inputs are cast to it, e.g. bfloat16 for CUDA).
        method: the method to run.

    Inputs are passed as contiguous CPU tensors (the ExecuTorch Python runtime takes host memory; a delegate copies
    to its device).
    """

    def __init__(self, path: str | Path, *, data_path: str | Path | None = None,
                 input_dtypes: Sequence[str | None] | None = None, method: str = "forward"):
        from executorch.runtime import Runtime

        self.path = Path(path)
        self.data_path = Path(data_path) if data_path else None
        self.input_dtypes = [getattr(torch, d) if d else None for d in (input_dtypes or [])]
        self._cleanup: Any = None  # removes the temporary directory of an in-memory export
        self.program = Runtime.get().load_program(self.path, data_path=self.data_path)
        self.method = self.program.load_method(method)
        if self.method is None:
            raise ValueError(f"{self.path} has no method {method!r}; it has {sorted(self.program.method_names)}")

    @classmethod
    def from_program_manager(cls, manager: Any, **kwargs: Any) -> ExecutorchRunner:
        """Write an ``ExecutorchProgramManager``'s ``.pte`` (and ``.ptd``) into a temporary directory owned by the
        runner, and open it from there (the runtime reads the file as a saved artifact would be read)."""
        directory = tempfile.mkdtemp(prefix="hfexport-executorch-")
        try:
            path = Path(directory) / PROGRAM_FILE
            with open(path, "wb") as file:
                manager.write_to_file(file)
            data_path = None
            if getattr(manager, "_tensor_data", None):  # set by write_to_file: weights kept outside the .pte
                manager.write_tensor_data_to_file(directory)
                data_files = sorted(Path(directory).glob(f"*{DATA_FILE_SUFFIX}"))
                if len(data_files) > 1:
                    raise ValueError(f"the program has {len(data_files)} data files ({[p.name for p in data_files]}); "
                                     "the ExecuTorch runtime loads one")
                data_path = data_files[0] if data_files else None
            runner = cls(path, data_path=data_path, **kwargs)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        runner._cleanup = weakref.finalize(runner, shutil.rmtree, directory, ignore_errors=True)
        return runner

    @property
    def files(self) -> list[Path]:
        return [p for p in (self.path, self.data_path) if p is not None]

    @property
    def data_file(self) -> str | None:
        return self.data_path.name if self.data_path else None

    def write_files(self, directory: Path) -> list[str]:
        """Copy ``model.pte`` (and its data file) into ``directory``; returns their names."""
        names = []
        for source in self.files:
            name = PROGRAM_FILE if source == self.path else source.name
            shutil.copyfile(source, Path(directory) / name)
            names.append(name)
        return names

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        """Run the top-level inputs ``args`` (signature order; pytrees allowed); returns the flat outputs."""
        leaves = pytree.tree_leaves(args)
        if self.input_dtypes and len(leaves) != len(self.input_dtypes):
            raise TypeError(f"expected {len(self.input_dtypes)} input leaves after flattening, got {len(leaves)}")
        flat = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                dtype = self.input_dtypes[i] if i < len(self.input_dtypes) else None
                leaf = leaf.detach().to("cpu")
                if dtype is not None and leaf.is_floating_point() and dtype.is_floating_point:
                    leaf = leaf.to(dtype)
                leaf = leaf.contiguous()
            flat.append(leaf)
        outputs = self.method.execute(flat)
        # The outputs live in the method's planned memory: copy them out before the next call reuses it.
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]


# ── Delegation report ──────────────────────────────────────────────────────────────────────────────────
_NOT_COMPUTE = ("sym_size", "sym_numel", "sym_stride", "executorch_prim", "_assert", "sym_constrain_range",
                "_local_scalar_dense", "torch.sym_")


def _is_compute(node: torch.fx.Node) -> bool:
    """A call that runs a kernel: not getitem, not Python/``executorch_prim`` sym arithmetic, not an assert."""
    if node.op != "call_function" or getattr(node.target, "__module__", None) in ("_operator", "math", "builtins"):
        return False
    name = str(node.target)
    return not any(k in name for k in _NOT_COMPUTE)


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    schema = getattr(target, "_schema", None)
    if schema is not None:  # aten::native_layer_norm + overload
        overload = schema.overload_name or "default"
        return f"{schema.name}.{overload}"
    return name


@dataclass
class DelegationReport:
    """How much of a lowered program runs inside delegates.

    Attributes:
        delegated_nodes: compute nodes inside delegates (``lowered_module_N.original_module``).
        portable_nodes: compute nodes left outside every delegate (portable kernels).
        num_delegates: ``executorch_call_delegate`` calls.
        portable_ops: op name (``aten::native_layer_norm.default``) -> count, for the nodes left out.
        missing_kernels: ops left out whose out-variant kernel is not linked into the runtime (the program would
            fail at load with ``Missing operator``).
    """

    delegated_nodes: int
    portable_nodes: int
    num_delegates: int
    portable_ops: Counter = field(default_factory=Counter)

    @property
    def fraction(self) -> float:
        """Delegated compute nodes / all compute nodes (1.0 for an empty program)."""
        total = self.delegated_nodes + self.portable_nodes
        return self.delegated_nodes / total if total else 1.0

    missing_kernels: list[str] = field(default_factory=list)


def delegation_report(edge_program: Any) -> DelegationReport:
    """Count compute nodes inside delegates and left on portable kernels.

    Args:
        edge_program: the ``EdgeProgramManager`` that ``to_edge_transform_and_lower`` returns (or its
            ``exported_program()``), before ``to_executorch``.
    """
    from executorch.exir.delegate import executorch_call_delegate

    program = edge_program.exported_program() if hasattr(edge_program, "exported_program") else edge_program
    gm = program.graph_module
    delegated = portable = delegates = 0
    ops: Counter = Counter()
    missing: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is executorch_call_delegate:
            delegates += 1
            lowered = getattr(gm, node.args[0].target)
            delegated += sum(_is_compute(n) for n in lowered.original_module.graph.nodes)
        elif _is_compute(node):
            portable += 1
            ops[_op_name(node.target)] += 1
            op = getattr(node.target, "_op", node.target)  # EdgeOpOverload -> the aten OpOverload
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and _portable_kernel_for(op) is None:
                missing.add(_op_name(node.target))
    return DelegationReport(delegated, portable, delegates, ops, sorted(missing))


@functools.cache
def portable_kernel_names() -> frozenset[str]:
    """The kernels linked into the ExecuTorch Python runtime (``aten::topk.values``, ...)."""
    from executorch.extension.pybindings import portable_lib

    return frozenset(portable_lib._get_operator_names())


# ── Backend preparations (stage 1) ──────────────────────────────────────────────────────────────────────
def place_model_and_inputs(ctx: ExportContext, device: str | torch.device, dtype: torch.dtype | None = None) -> None:
    """Move the model to ``device`` (and its floating parameters and buffers to ``dtype``) for this export; move
    the inputs likewise and make them contiguous.

    The model is moved back when the export ends (``ctx.stack``), also when it fails: a model that was already
    in place is not touched at all. The inputs are the export's own copies, never the caller's tensors.
    """
    device = torch.device(device)
    model = ctx.model
    tensors = [(m, kind, name, t) for m in model.modules()
               for kind, table in (("param", m._parameters), ("buffer", m._buffers))
               for name, t in table.items() if t is not None]

    def moved(t: torch.Tensor) -> bool:
        return t.device != device or (dtype is not None and t.is_floating_point() and t.dtype != dtype)

    if any(moved(t) for *_, t in tensors):
        saved = [(m, kind, name, t.data if kind == "param" else t) for m, kind, name, t in tensors]

        def restore() -> None:
            for m, kind, name, original in saved:
                if kind == "param":
                    m._parameters[name].data = original
                else:
                    m._buffers[name] = original

        ctx.stack.callback(restore)
        model.to(device=device)
        if dtype is not None:
            model.to(dtype=dtype)  # floating parameters and buffers only

    def convert(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device=device)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t.contiguous()

    ctx.inputs = {name: pytree.tree_map_only(torch.Tensor, convert, value) for name, value in ctx.inputs.items()}


@register_backend_prepare("xnnpack")
def prepare_for_xnnpack(ctx: ExportContext) -> BackendPreparation:
    """CPU, float32, contiguous inputs and one ``XnnpackPartitioner``; ops it does not take stay on portable kernels.

    **Why**: XNNPACK's partitioner and serializer need a CPU graph, and the tests verify against float32 eager;
    a 0 stride (an expanded input) is rejected by ExecuTorch's spec propagation, hence contiguous inputs.
    **Upstream**: n/a (the documented XNNPACK lowering recipe).
    **Remove when**: never: this is the variant's definition. Disabled, the model is traced as it is with no
    partitioner (everything on portable kernels).
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    place_model_and_inputs(ctx, "cpu", torch.float32)
    return BackendPreparation([XnnpackPartitioner()], dtype=torch.float32)


@register_backend_prepare("cuda")
def prepare_for_cuda(ctx: ExportContext) -> BackendPreparation:
    """bfloat16 and a ``CudaPartitioner`` (AOTInductor); the weights go to a ``.ptd`` beside ``model.pte``.

    Checks for a visible GPU before anything else: AOTInductor compiles and autotunes Triton kernels on the GPU at
    export time, so without one the export fails late with ``RuntimeError: Found no NVIDIA driver``.

    **Why**: ExecuTorch's CUDA backend (``executorch.backends.cuda``, experimental in 1.5.1) runs bfloat16 and
    compiles the whole graph into one AOTI delegate; its example exports use ``_skip_dim_order=True`` and
    ``_check_ir_validity=False`` (``examples/models/*/export_*.py``). Unverified on this project's CI (no GPU,
    and the CPU wheel's runtime has no ``CudaBackend``).
    **Upstream**: n/a (ExecuTorch's CUDA lowering recipe).
    **Remove when**: never: this is the variant's definition.
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


# ── Torch patches (stage 2) ────────────────────────────────────────────────────────────────────────────
def _nonzero_row_major(input: torch.Tensor) -> torch.Tensor:
    """``torch.nonzero(input)`` built from a boolean index of ``arange`` (row-major ``[nnz, dim]``, contiguous)."""
    flat = input.reshape(-1) != 0
    positions = torch.arange(flat.shape[0], device=input.device)[flat]  # [nnz], in row-major order
    coords = []
    for size in reversed(input.shape):
        coords.append(positions % size)
        positions = torch.div(positions, size, rounding_mode="floor")
    return torch.stack(coords[::-1], dim=1)


@register_patch("executorch", "torch.nonzero", "torch.Tensor.nonzero", "torch.argwhere", "torch.Tensor.argwhere")
def _patch_nonzero(original: Any) -> Any:
    """Traces ``nonzero`` (and ``argwhere``) as a boolean index of ``arange`` plus ``%``/``//``, row-major.

    Replaces ``nonzero(x)`` by ``stack([(arange(numel)[x.flatten() != 0] // stride_d) % size_d for d], dim=1)``;
    ``as_tuple=True`` unbinds that. Same values and order as eager (indices in row-major order).

    **Why**: torch's fake ``nonzero`` returns a column-major ``[nnz, dim]`` tensor (strides ``(1, nnz)``), so
    ExecuTorch plans its output with dim order ``(1, 0)``, but the portable ``nonzero.out`` kernel writes row-major
    indices into it. The next portable kernel then rejects the layout mismatch at run time: ``Check failed
    (all_contiguous || all_channels_last): 2 input tensors have different dim orders`` in
    ``aten::squeeze_copy.dims_out`` (``torch.nonzero(keep).squeeze(-1)``, case s10), ``aten::mul.out`` for
    ``torch.nonzero(x) * 2`` (``0x12``). A boolean index (``aten.index.Tensor``, case c10) has a contiguous result.
    **Upstream**: pytorch/executorch#11086 (layouts declared by an op's metadata but not produced by its kernel
    fail at run time with "different dim orders"); the kernel: kernels/portable/cpu/op_nonzero.cpp.
    **Remove when**: ExecuTorch plans ``nonzero``'s output in the default dim order (s10 runs with
    ``disable=("_patch_nonzero",)``).
    """

    inside = threading.local()  # our own arange[mask] must not come back here

    @functools.wraps(original)
    def nonzero(input: Any, *args: Any, **kwargs: Any) -> Any:
        as_tuple = kwargs.pop("as_tuple", False)
        # torch's own callers (the meta kernel of boolean indexing) keep the original: only the model's calls change
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if (args or kwargs or not isinstance(input, torch.Tensor) or input.dim() == 0
                or getattr(inside, "active", False) or caller == "torch" or caller.startswith("torch.")):
            if as_tuple:
                kwargs["as_tuple"] = as_tuple
            return original(input, *args, **kwargs)
        inside.active = True
        try:
            result = _nonzero_row_major(input)
        finally:
            inside.active = False
        return result.unbind(1) if as_tuple else result

    return nonzero


# ── ExecuTorch patches (stage 3) ────────────────────────────────────────────────────────────────────────
@register_patch("executorch.internals",
                "executorch.exir.tensor.dim_order_from_stride",
                "executorch.exir.tensor_layout.dim_order_from_stride",
                "executorch.exir.emit._emitter.dim_order_from_stride",
                "executorch.exir.passes.replace_view_copy_with_view_pass.dim_order_from_stride")
def _patch_dim_order_from_stride(original: Any) -> Any:
    """Sorts strides that hold unbacked symbols without guarding: an unprovable ``a < b`` counts as False.

    **Why**: after a boolean selection (``x[keep]``, case c10) the batch is an unbacked ``u0``, and a decomposed
    SDPA has strides such as ``(16*u0, 16, 1)``. ``to_executorch`` -> ``SpecPropPass`` -> ``TensorSpec`` ->
    ``dim_order_from_stride`` compares them and raises ``GuardOnDataDependentSymNode: Could not guard on
    data-dependent expression 16*u7 < 16`` (executorch/exir/tensor.py). That function's comment says
    ``u0 < u1 (no info) -> DDE`` and its last line evaluates ``a < b``. The original runs first; only when it raises
    is the sort redone with unprovable comparisons answered False (the divisibility rule still proves
    ``16 < 16*u0``), which yields the contiguous order the traced strides describe.
    **Upstream**: pytorch/executorch#19516 (replaced ``guard_size_oblivious`` in this sort with explicit reasoning
    that keeps the fallback ``a < b``), pytorch/executorch#4261; the pattern: pytorch/pytorch#180202, #181084.
    **Remove when**: ``dim_order_from_stride`` orders unbacked strides without guarding (c10 lowers with
    ``disable=("_patch_dim_order_from_stride",)``).
    """
    from torch.fx.experimental.symbolic_shapes import (
        GuardOnDataDependentSymNode,
        guard_or_false,
        guard_or_true,
    )

    def less(a: Any, b: Any) -> bool:
        if guard_or_false(a < b):
            return True
        if guard_or_false(b % a == 0) and guard_or_true(a != b):
            return True
        try:
            return bool(a < b)
        except GuardOnDataDependentSymNode:
            return False

    @functools.wraps(original)
    def dim_order_from_stride(stride: Any) -> Any:
        try:
            return original(stride)
        except GuardOnDataDependentSymNode:
            pass
        for s in stride:
            torch._check(s != 0, lambda: "0 in strides is not supported for ExecuTorch.")
        compare = lambda x, y: -1 if less(x[1], y[1]) else (1 if less(y[1], x[1]) else 0)  # noqa: E731
        order = sorted(enumerate(stride), key=functools.cmp_to_key(compare), reverse=True)
        return tuple(i for i, _ in order)

    return dim_order_from_stride


@register_patch("executorch.internals", "executorch.exir.verification.arg_validator.EdgeOpArgValidator.call_function")
def _patch_arg_validator_list_return(original: Any) -> Any:
    """Hands the edge dtype validator a ``Tensor[]`` result as one return value, not as the list of its tensors.

    **Why**: ``EdgeOpArgValidator.call_function`` (run by the edge verifier inside ``to_edge``) iterates over
    ``node.meta["val"]`` as the sequence of the op's returns. For an op with a single ``Tensor[]`` return
    (``split_with_sizes_copy``, ``unbind_copy``) that sequence *is* the list, so the first tensor is taken as the
    return and ``range(len(tensor))`` calls ``__index__`` on its first dim. A dynamic batch is thereby guarded to
    its trace-time value (``set_replacement s43 = 2 (range_refined_to_singleton)``): GPT-2 traced at batch 2
    (``c_attn(x).split(n_embd, dim=2)`` on ``[batch, seq, 3 * n_embd]``) lowers with a static ``arange(batch)``
    and fails at batch 3 with ``Attempted to resize a static tensor. Expected shape (2), but received (3)`` in
    ``aten::arange.start_out`` (``0x12``). An unbacked first dim raises ``GuardOnDataDependentSymNode`` instead.
    The replacement wraps the list in a 1-tuple for the call (and puts ``meta["val"]`` back after it), so that
    ``len`` counts tensors. Splits along dim 0 or of a static first dim (c19) were never affected.
    **Upstream**: none found in pytorch/executorch (the code is unchanged on main, exir/verification/
    arg_validator.py); the runtime symptom is the one of pytorch/executorch#1350.
    **Remove when**: the validator wraps single list returns itself (GPT-2 traced at batch 2 runs at batch 3 with
    ``disable=("_patch_arg_validator_list_return",)``).
    """

    @functools.wraps(original)
    def call_function(self: Any, target: Any, args: Any, kwargs: Any) -> Any:
        returns = getattr(getattr(target, "_schema", None), "returns", None)
        node = getattr(self, "node", None)
        value = node.meta.get("val") if node is not None else None
        if (returns is None or len(returns) != 1 or returns[0].type != torch.ListType.ofTensors()
                or not isinstance(value, list | tuple)):
            return original(self, target, args, kwargs)
        node.meta["val"] = (value,)
        try:
            return original(self, target, args, kwargs)
        finally:
            node.meta["val"] = value

    return call_function


def _sort_pairwise(x: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A stable sort from comparisons only: ``rank[i] = #{j: x_j before x_i} + #{j < i: x_j == x_i}``.

    Uses lt/gt/eq/logical ops/sum/gather (all with portable kernels). NaN sorts last ascending and first
    descending, as in eager. Memory is O(n^2) along ``dim`` (fine for token ranking and routing; not for n=32k).
    """
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.long)
    dim = dim % x.dim()
    xt = x.movedim(dim, -1)
    n = xt.shape[-1]
    xi, xj = xt.unsqueeze(-1), xt.unsqueeze(-2)  # [..., n(i), 1], [..., 1, n(j)]
    if x.is_floating_point():
        nan_i, nan_j = torch.isnan(xi), torch.isnan(xj)
        bigger_j = (xj > xi) | (nan_j & ~nan_i)  # NaN is the largest value
        smaller_j = (xj < xi) | (nan_i & ~nan_j)
        equal = (xj == xi) | (nan_i & nan_j)
    else:
        bigger_j, smaller_j, equal = xj > xi, xj < xi, xj == xi
    before = bigger_j if descending else smaller_j
    positions = torch.arange(n, device=x.device)
    earlier = positions.unsqueeze(-1) > positions.unsqueeze(0)  # [i, j]: j < i
    rank = (before | (equal & earlier)).sum(-1)  # [..., n]: where element i goes
    onehot = rank.unsqueeze(-1) == positions  # [..., i, r]
    index = (onehot.long() * positions.unsqueeze(-1)).sum(-2)  # [..., r]: which i lands at r
    return torch.gather(xt, -1, index).movedim(-1, dim), index.movedim(-1, dim)


def _decompose_sort_stable(x: torch.Tensor, *, stable: bool | None = None, dim: int = -1,
                           descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _sort_pairwise(x, dim, descending)


def _decompose_sort(x: torch.Tensor, dim: int = -1, descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _sort_pairwise(x, dim, descending)


# Decompositions we own, for ops that neither Core ATen decompositions nor portable kernels cover.
_ET_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.sort.stable: _decompose_sort_stable,  # not Core ATen, no portable kernel
    aten.sort.default: _decompose_sort,  # Core ATen, but no portable kernel in executorch 1.5.1
}


_STRICT = threading.local()  # set while we ask the verifier ourselves: then _patch_aten_dialect_verifier admits nothing


def _rejected_by_edge(op: Any) -> bool:
    """Whether ExecuTorch's ATen-dialect verifier raises "is not in Core ATen opset" for ``op``."""
    from executorch.exir.verification.verifier import EXIRATenDialectVerifier
    from torch._export.verifier import SpecViolationError

    _STRICT.on = True
    try:
        EXIRATenDialectVerifier().check_valid_op(op)
    except SpecViolationError:
        return True
    finally:
        _STRICT.on = False
    return False


@functools.cache
def _rejected_ops_with_decomposition() -> dict[Any, Callable[..., Any]]:
    """``torch._decomp.decomposition_table`` entries for the aten ops the edge verifier rejects."""
    from torch._decomp import decomposition_table

    return {op: fn for op, fn in decomposition_table.items()
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and _rejected_by_edge(op)}


@register_patch("executorch.internals",
                "executorch.exir.program._program._default_decomposition_table",
                "executorch.exir.tracer._default_decomposition_table")
def _patch_default_decomposition_table(original: Any) -> Any:
    """Adds every available decomposition of a non-Core-ATen op to the table ``to_edge`` decomposes with.

    ``original()`` (Core ATen decompositions + ``linalg_vector_norm``) is extended with the
    ``torch._decomp.decomposition_table`` entries of the ops the edge verifier rejects, and with our own
    comparison-based stable sort for ``sort.stable``/``sort.default`` (so ``argsort`` too). Partitioners still
    pop the ops they keep whole (``linear`` for XNNPACK): ``to_edge_transform_and_lower`` removes its
    ``ops_to_not_decompose`` from the table this returns.

    **Why**: ``to_edge`` rejects non-Core-ATen ops: ``SpecViolationError: Operator torch._ops.aten.sort.stable is
    not in Core ATen opset`` (c21). Listing the op in ``_core_aten_ops_exception_list`` only moves the failure to
    method load when the runtime has no kernel (``Missing operator: aten::sort.values_stable``; there is no
    ``aten::sort.values`` either, though ``sort.default`` is Core ATen). Decomposing before lowering with
    ``run_decompositions(...)`` is wrong: it also decomposes ``linear`` and XNNPACK's ``ConvertToLinearPass``
    fails (``t() expects a tensor with <= 2 dimensions, but self is 3D``). The table must be the one ``to_edge``
    uses.
    **Upstream**: apple/coremltools#2782 (``sort.stable`` rejected by ``to_edge``); pytorch/executorch#11320
    (portable library Core ATen coverage: no ``sort`` kernel); pytorch/executorch#4742 (exception list, then
    kernel not found).
    **Remove when**: ``to_edge_transform_and_lower`` takes a user decomposition table and the portable library
    ships ``sort`` (c21 lowers with ``disable=("_patch_default_decomposition_table",)``).
    """

    @functools.wraps(original)
    def _default_decomposition_table(*args: Any, **kwargs: Any) -> Any:
        table = original(*args, **kwargs)
        for op, fn in _rejected_ops_with_decomposition().items():
            table.setdefault(op, fn)
        table.update(_ET_DECOMPOSITIONS)
        return table

    return _default_decomposition_table


def _portable_kernel_for(op: Any) -> str | None:
    """The portable kernel that would run ``op`` (``aten::repeat_interleave.Tensor_out``), or None."""
    from executorch.exir.operator.convert import to_out_variant

    kernels = portable_kernel_names()
    try:
        out, _ = to_out_variant(op)
    except Exception:  # e.g. pow: its int overloads break the lookup; any kernel of the op's name then
        base = f"{op._schema.name}."
        return next((k for k in sorted(kernels) if k.startswith(base)), None)
    name = f"{out._schema.name}.{out._overloadname}"
    return name if name in kernels else None


@register_patch("executorch.internals",
                "executorch.exir.verification.verifier.EXIRATenDialectVerifier",
                "executorch.exir.program._program.EXIRATenDialectVerifier")
def _patch_aten_dialect_verifier(original: Any) -> Any:
    """Lets the edge verifiers accept a non-Core-ATen aten op when the portable library has its out-variant kernel.

    Wraps the ``check_valid_op`` of the verifier class that ``EXIRATenDialectVerifier(...)`` builds (the edge
    verifier checks aten ops through it too): when the original raises ``SpecViolationError`` for an aten op whose
    out variant (``executorch.exir.operator.convert.to_out_variant``) is a kernel linked into the runtime, the op is
    accepted and recorded (``manifest["executorch"]["non_core_aten_on_portable_kernels"]``). This is what
    ``EdgeCompileConfig(_core_aten_ops_exception_list=[op])`` does, for the ops that only appear *inside*
    ``to_edge``'s own decompositions and so cannot be listed beforehand.

    **Why**: ``torch.repeat_interleave(x, counts, dim=0)`` (c01, MoE token dispatch) traces to
    ``aten.repeat_interleave.self_Tensor``, whose decomposition inside ``to_edge`` emits
    ``aten.repeat_interleave.Tensor``: not Core ATen, no decomposition in ``torch._decomp``, so ``to_edge`` raises
    ``SpecViolationError: Operator torch._ops.aten.repeat_interleave.Tensor is not in Core ATen opset``, although
    the runtime has ``aten::repeat_interleave.Tensor_out``. Ops without a kernel (``sort.stable``) are still
    rejected here, and are decomposed by ``_patch_default_decomposition_table`` instead.
    **Upstream**: pytorch/executorch#4742 (non-Core-ATen ops with kernels need the exception list, then fail at
    load if no kernel); pytorch/pytorch#156873 (c01's op).
    **Remove when**: ``repeat_interleave.Tensor`` is Core ATen, or ``to_edge`` checks kernels instead of the
    opset (c01 lowers with ``disable=("_patch_aten_dialect_verifier",)``).
    """
    from torch._export.verifier import SpecViolationError

    @functools.wraps(original)
    def EXIRATenDialectVerifier(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the name it replaces
        verifier = original(*args, **kwargs)
        cls = verifier if isinstance(verifier, type) else type(verifier)
        check = cls.check_valid_op

        def check_valid_op(self: Any, op: Any) -> None:
            try:
                return check(self, op)
            except SpecViolationError:
                admissible = (isinstance(op, torch._ops.OpOverload) and op.namespace == "aten"
                              and not op._schema.is_mutable and not getattr(_STRICT, "on", False))
                if not admissible or _portable_kernel_for(op) is None:
                    raise
                _state().admitted_ops.append(str(op))
                return None

        cls.check_valid_op = check_valid_op  # a fresh class per call: nothing else sees this
        return verifier

    return EXIRATenDialectVerifier


# ── FX program fixes (stage 4) ──────────────────────────────────────────────────────────────────────────
def _shape_envs(program: torch.export.ExportedProgram) -> list[Any]:
    """Every ShapeEnv that the symbolic sizes in the nodes' ``meta["val"]`` point to."""
    envs: dict[int, Any] = {}
    for node in program.graph.nodes:
        for value in pytree.tree_leaves(node.meta.get("val")):
            symbols: list[Any] = []
            if isinstance(value, torch.Tensor):
                symbols = [s for s in (*value.shape, *value.stride()) if isinstance(s, torch.SymInt)]
            elif isinstance(value, torch.SymInt):
                symbols = [value]
            for s in symbols:
                envs.setdefault(id(s.node.shape_env), s.node.shape_env)
    return list(envs.values())


@register_fx_program_fix("executorch")
def _fix_unbounded_range_constraints(exported_program: torch.export.ExportedProgram) -> bool:
    """Gives every dynamic dim with an unbounded range ``[lo, int_oo]`` the finite bound ``[lo, dim_upper_bound]``.

    Rewrites ``range_constraints`` and the ShapeEnv(s) that the symbolic sizes in ``meta["val"]`` point to:
    ExecuTorch evaluates upper bounds through ``shape_env.var_to_range``, not through ``range_constraints``.
    The bound is ``ExecutorchConfig.dim_upper_bound``; explicit ``Dim(max=...)`` bounds are left alone.

    **Why**: ``Dim.AUTO`` (``dynamic=True``) gives unbounded ranges. ExecuTorch plans memory for the upper bound of
    every dynamic dim (``executorch.exir.sym_util.eval_upper_bound``) and, for ``int_oo``, silently falls back to
    the trace-time size: the program lowers and then fails on the first larger input (``Attempted to resize a
    bounded tensor with a maximum capacity of 2 elements to 3 elements``, ``method->execute() failed with error
    0x12``). For unbacked sizes (no trace hint, c01) lowering fails instead: ``Cannot evaluate a finite upper
    bound for symbolic expression u25 (int_oo) and no trace hint is available``.
    **Upstream**: pytorch/executorch#8766 (unbounded dynamic memory is not supported), pytorch/executorch#3636.
    **Remove when**: ExecuTorch plans unbounded dims dynamically, or rejects them at lowering with a clear error.
    """
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    state = _state()
    bound = state.dim_upper_bound

    def narrowed(rng: Any) -> Any:
        if rng.upper is int_oo or not getattr(rng.upper, "is_finite", True):
            lower = int(rng.lower) if rng.lower is not -int_oo and getattr(rng.lower, "is_finite", True) else 0
            return ValueRanges(lower, max(lower, bound))
        return None

    changed = False
    tables = [exported_program.range_constraints] + [env.var_to_range for env in _shape_envs(exported_program)]
    for table in tables:
        for symbol, rng in list(table.items()):
            new = narrowed(rng)
            if new is not None:
                table[symbol] = new
                state.bounded[str(symbol)] = (int(new.lower), int(new.upper))
                changed = True
    return changed


# ── FX node fixes (stage 5) ─────────────────────────────────────────────────────────────────────────────
def _value(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _emit(gm: torch.fx.GraphModule, like: torch.fx.Node, fn: Any, *args: Any) -> torch.fx.Node:
    """A ``call_function`` node ``fn(*args)`` with ``like``'s metadata and a computed ``meta["val"]``."""
    new = gm.graph.call_function(fn, args)
    new.meta = {k: v for k, v in like.meta.items() if k != "val"}
    values = [_value(a) for a in args]
    if all(v is not None for v in values):
        new.meta["val"] = fn(*values)
    return new


def _replace_with_chain(gm: torch.fx.GraphModule, node: torch.fx.Node, fn: Any, operands: list[Any]) -> None:
    """Fold ``operands`` with the binary Python op ``fn`` before ``node``; replace ``node`` with the result."""
    with gm.graph.inserting_before(node):
        acc = operands[0]
        for rhs in operands[1:]:
            acc = _emit(gm, node, fn, acc, rhs)
    node.replace_all_uses_with(acc)
    gm.graph.erase_node(node)


def _is_symint_arg(arg: Any) -> bool:
    return isinstance(_value(arg), int | torch.SymInt) and not isinstance(_value(arg), bool)


@register_fx_node_fix("executorch")
def _fix_sym_pow(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``operator.pow(s, k)`` on a SymInt with a small int ``k`` by ``s * s * ...`` (``operator.mul``).

    **Why**: ``to_edge`` has no ``executorch_prim`` op for ``pow`` (``_PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS`` maps
    add/sub/mul/floordiv/truediv/mod/neg/eq/gt/lt/ge/le/..., not pow and not ne): ``x.new_zeros(s ** 2)`` fails
    with ``InternalError: invalid target for call_function <built-in function pow>``. ExecuTorch maps the
    ``operator.mul`` nodes to ``executorch_prim::mul.Scalar`` itself.
    **Upstream**: pytorch/executorch#11988 (the same gap for ``sym_max``, since added to the table); none found
    for ``pow``. Table: executorch/exir/passes/executorch_prim_ops_registry.py.
    **Remove when**: ``executorch_prim`` has ``pow.Scalar``.
    """
    if node.op != "call_function" or node.target not in (operator.pow, pow) or len(node.args) != 2:
        return False
    base, exponent = node.args
    if not isinstance(base, torch.fx.Node) or not _is_symint_arg(base) or isinstance(exponent, bool) \
            or not isinstance(exponent, int) or not 1 <= exponent <= 8:
        return False
    _replace_with_chain(gm, node, operator.mul, [base] * exponent)
    return True


@register_fx_node_fix("executorch")
def _fix_sym_ne(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``operator.ne(a, b)`` on SymInts by ``(a - b) * (a - b) > 0`` (sub, mul and gt only).

    **Why**: ``to_edge`` fails with ``InternalError: invalid target for call_function <built-in function ne>`` (no
    ``executorch_prim::ne``). The obvious ``sym_not(eq(a, b))`` does not work: ``torch.sym_not`` as a target
    trips the edge verifier, and ``executorch_prim.sym_not.Scalar`` is Python ``not a``, which specialises on the
    trace hint during the edge re-trace (the program then returns the traced answer for every input). sub, mul
    and gt map to ``executorch_prim`` ops and stay symbolic.
    **Upstream**: pytorch/executorch#11988 (the same gap for ``sym_max``); none found for ``ne``.
    **Remove when**: ``executorch_prim`` has ``ne.Scalar`` (and ``sym_not`` stops specialising).
    """
    if node.op != "call_function" or node.target is not operator.ne or len(node.args) != 2:
        return False
    a, b = node.args
    if not (_is_symint_arg(a) and _is_symint_arg(b)) or not any(isinstance(v, torch.fx.Node) for v in (a, b)):
        return False
    with gm.graph.inserting_before(node):
        diff = _emit(gm, node, operator.sub, a, b)
        new = _emit(gm, node, operator.gt, _emit(gm, node, operator.mul, diff, diff), 0)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_sym_sum(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``torch.sym_sum([a, b, c])`` by ``a + b + c`` (``operator.add``).

    **Why**: ``to_edge`` fails with ``ExportPassBaseError: Unsupported target type: <function sym_sum>`` (it is
    neither in the Python-sym-op table nor an OpOverload); torch emits it for sums of several sizes
    (``torch.cat`` of symbolic pieces, ``sum(x.shape)``).
    **Upstream**: pytorch/executorch#11988 (the same gap for ``sym_max``); none found for ``sym_sum``.
    **Remove when**: ExecuTorch maps ``torch.sym_sum``.
    """
    if node.op != "call_function" or node.target is not torch.sym_sum or not node.args:
        return False
    operands = list(node.args[0])
    if not operands:
        return False
    _replace_with_chain(gm, node, operator.add, operands)
    return True


@register_fx_node_fix("executorch")
def _fix_pow_small_int_exponent(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``aten.pow.Tensor_Scalar(x, k)`` for k in {3, 4} (also 2.0, 3.0, 4.0) by a chain of ``aten.mul.Tensor``.

    **Why**: not a correctness fix (the portable ``pow`` matches eager), a delegation one: XNNPACK's partitioner takes
    ``pow`` only with the *int* exponent 2 (``PowConfig`` in backends/xnnpack/partition/config/
    generic_node_configs.py), so ``x ** 3`` and GPT-2's ``pow(x, 3.0)`` (gelu_new) stay on a portable kernel and
    split the delegate around them, while ``mul`` is delegated. ``pow(x, 2)`` is left alone (XNNPACK takes it).
    **Upstream**: none found (XNNPACK's ``PowConfig``: "only support power == 2").
    **Remove when**: the XNNPACK partitioner takes ``pow`` with other small integer exponents.
    """
    if node.op != "call_function" or node.target is not aten.pow.Tensor_Scalar:
        return False
    x, k = node.args[0], node.args[1]
    if isinstance(k, bool) or not isinstance(k, int | float) or k not in (2, 3, 4):
        return False
    if isinstance(k, int) and k == 2:  # delegated as it is
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        return False
    with gm.graph.inserting_before(node):
        acc = x
        for _ in range(int(k) - 1):
            acc = gm.graph.call_function(aten.mul.Tensor, (acc, x))
            acc.meta = dict(node.meta)
    node.replace_all_uses_with(acc)
    gm.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_sdpa_contiguous_output(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Puts ``aten.clone(memory_format=contiguous_format)`` after ``aten.scaled_dot_product_attention``.

    **Why**: ``to_edge`` runs ``run_decompositions``, which replaces SDPA by its math decomposition, whose output
    strides differ from the traced ones (``[b, h, s, d]`` laid out as ``[b, s, h, d]``). A later
    ``transpose(1, 2).reshape(...)`` then decomposes to a *view* and the next ``view`` fails: GPT-2 (``Conv1D``'s
    ``x.view(-1, x.size(-1))``) raises ``ValueError: Cannot view a tensor with shape torch.Size([2, 8, 32]) and
    strides (32, 64, 1) as a tensor with shape (16, 32)!``, with or without a partitioner (plain
    ``ep.run_decompositions()`` fails the same way). The clone pins the traced contiguous layout; XNNPACK
    delegates it.
    **Upstream**: pytorch/pytorch#136543 (same error, traced to the SDPA decomposition), pytorch/pytorch#169732
    ("Maintain contiguity in sdpa").
    **Remove when**: ``run_decompositions()`` of the tiny GPT-2 with SDPA attention succeeds.
    """
    if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
        return False
    if any(u.target is aten.clone.default for u in node.users):
        return False
    with gm.graph.inserting_after(node):
        clone = gm.graph.call_function(aten.clone.default, (node,), {"memory_format": torch.contiguous_format})
    clone.meta = dict(node.meta)
    node.replace_all_uses_with(clone, delete_user_cb=lambda user: user is not clone)
    return True  # the SDPA node stays, its users now read the clone

