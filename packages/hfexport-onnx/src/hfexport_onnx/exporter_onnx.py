"""OnnxExporter: the dynamo pipeline, then ``torch.onnx.export`` to ``model.onnx`` + ``model.onnx.data``, run on ORT.

Five stages around ``torch.onnx.export`` (the dynamo pipeline runs nested inside stage 3):

1. Torch patches — ``@register_patch("onnx", ...)``, active while tracing and lowering.
2. ONNX patches — ``@register_patch("onnx.decomposition", ...)``: re-run the FX node fixes right after
   ``run_decompositions`` inside ``torch.onnx.export`` (same registry as stage 3).
3. FX node fixes — trace with the dynamo pipeline, then ``@register_fx_node_fix("onnx")`` rewrites.
4. ONNX translations — ``_aten_*`` functions in ``_ONNX_TRANSLATION_TABLE``, passed to ``torch.onnx.export``.
5. ONNX IR fixes — ``_fix_ir_*`` functions in ``_IR_FIXES``, then the onnxscript optimizer (unless
   ``optimize=False`` or the model class is in ``ONNX_DISABLE_OPTIMIZE``; a crash falls back to the unoptimized
   model with a warning), then the ONNX Runtime session.

Every workaround (``_patch_*``, ``_fix_*``, ``_fix_ir_*``, ``_aten_*``) can be left out by name with
``disable=("<function name>",)``; its docstring says **Why**, **Upstream** and **Remove when**.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import onnx
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree
from onnxscript import opset18 as op

from hfexport import (
    ExportConfig,
    ExportContext,
    ExportedModel,
    FixReport,
    Stage,
    apply_fx_node_fixes,
    patch_context,
    register_fx_node_fix,
    register_patch,
    workarounds_for,
)
from hfexport._artifact import flatten_with_names
from hfexport_dynamo._pytree import register_transformers_pytrees
from hfexport_dynamo.exporter_dynamo import DynamoConfig, DynamoExporter

__all__ = [
    "MODEL_FILE",
    "ONNX_DISABLE_OPTIMIZE",
    "OnnxConfig",
    "OnnxConversionError",
    "OnnxExporter",
    "OnnxRunner",
    "OnnxSessionError",
    "OptimizerFallbackWarning",
    "UnsupportedOpsetError",
]

logger = logging.getLogger("hfexport")
aten = torch.ops.aten

MODEL_FILE = "model.onnx"
DATA_FILE = f"{MODEL_FILE}.data"
TORCHLIB_OPSET = 18  # the opset torch.onnx's function library (torchlib) is written for
MIN_OPSET = 7  # the lowest opset the ONNX version converter handles

# Model class -> the upstream onnxscript bug that makes the optimizer unusable for it. Only entries that were
# reproduced on the pinned toolchain; the optimizer-crash fallback (stage 5) already covers unknown ones, so an
# entry only saves the failed attempt and its re-export. Expected to shrink.
ONNX_DISABLE_OPTIMIZE: dict[str, str] = {}


class UnsupportedOpsetError(ValueError):
    """The graph cannot be expressed in the requested ONNX opset."""


class OnnxConversionError(RuntimeError):
    """``torch.onnx.export`` failed; the message leads with the innermost error (the op or node at fault)."""


class OnnxSessionError(RuntimeError):
    """ONNX Runtime refused the model; the message names the node and op it refused."""


class OptimizerFallbackWarning(UserWarning):
    """The onnxscript optimizer crashed; the unoptimized model was kept."""


def _available_providers() -> list[str]:
    import onnxruntime

    return list(onnxruntime.get_available_providers())


@dataclass
class OnnxConfig(DynamoConfig):
    """Options of the ``onnx`` backend.

    Attributes:
        opset_version: the ONNX opset of the default domain. torch.onnx writes opset 18 and converts down
            to lower ones when the graph allows it; an opset lower than the graph needs fails the export.
        optimize: run the onnxscript optimizer (constant folding, inlining, dead code) on the model.
        providers: ONNX Runtime execution providers of the runner, in priority order.
    """

    opset_version: int = TORCHLIB_OPSET
    optimize: bool = True
    providers: tuple[str, ...] = ("CPUExecutionProvider",)

    def __post_init__(self) -> None:
        super().__post_init__()
        highest = onnx.defs.onnx_opset_version()
        if (isinstance(self.opset_version, bool) or not isinstance(self.opset_version, int)
                or not MIN_OPSET <= self.opset_version <= highest):
            raise ValueError(f"opset_version must be an int from {MIN_OPSET} to {highest} (onnx "
                             f"{onnx.__version__}); {TORCHLIB_OPSET} is what torch.onnx writes natively; "
                             f"got {self.opset_version!r}")
        if not isinstance(self.optimize, bool):
            raise TypeError(f"optimize must be True or False, got {self.optimize!r}")
        if isinstance(self.providers, str):
            self.providers = (self.providers,)
        self.providers = tuple(self.providers)
        available = _available_providers()
        unknown = [p for p in self.providers if p not in available]
        if not self.providers or unknown:
            raise ValueError(f"providers must name execution providers of the installed onnxruntime; "
                             f"{unknown or 'none given'} not available; valid values: {', '.join(available)}")


# ── ONNX-side state of one export, passed to the decomposition hook ──────────────────────────────────────
@dataclass
class _Decomposition:
    fixes: list[Any]
    report: FixReport = field(default_factory=FixReport)


_DECOMPOSITION_FIXES: contextvars.ContextVar[_Decomposition | None] = contextvars.ContextVar(
    "hfexport_onnx_decomposition_fixes", default=None)


class OnnxExporter(DynamoExporter):
    """Export to ONNX (``model.onnx`` + ``model.onnx.data``), verified on ONNX Runtime."""

    name: ClassVar[str] = "onnx"
    config_class: ClassVar[type[ExportConfig]] = OnnxConfig
    scopes: ClassVar[tuple[str, ...]] = ("dynamo", "onnx", "onnx.decomposition")
    toolchain: ClassVar[tuple[str, ...]] = (*DynamoExporter.toolchain, "onnx", "onnxscript", "onnx-ir",
                                            "onnxruntime", "hfexport-onnx")
    tested_versions: ClassVar[dict[str, str]] = {**DynamoExporter.tested_versions, "onnx": "1.23.2",
                                                 "onnxscript": "0.7.2", "onnx-ir": "1.1.0", "onnxruntime": "1.32.0"}
    stages: ClassVar[tuple[Stage, ...]] = (
        Stage(1, "Torch patches", '@register_patch("onnx", ...)', "stage_torch_patches"),
        Stage(2, "ONNX patches", '@register_patch("onnx.decomposition", ...)', "stage_onnx_patches"),
        Stage(3, "FX node fixes", '@register_fx_node_fix("onnx")', "stage_fx_node_fixes",
              runs="torch.export.export"),
        Stage(4, "ONNX translations", "_ONNX_TRANSLATION_TABLE", "stage_onnx_translations",
              runs="torch.onnx.export"),
        Stage(5, "ONNX IR fixes", "_IR_FIXES", "stage_onnx_ir_fixes",
              runs="onnxscript optimizer, onnxruntime.InferenceSession"),
    )

# ── Stage 1: Torch patches ──
    def stage_torch_patches(self, ctx: ExportContext) -> None:
        report = ctx.stack.enter_context(patch_context(("onnx",), ctx.config.disable))
        _record_patches(ctx, report)

# ── Stage 2: ONNX patches ──
    def stage_onnx_patches(self, ctx: ExportContext) -> None:
        report = ctx.stack.enter_context(patch_context(("onnx.decomposition",), ctx.config.disable))
        _record_patches(ctx, report)
        state = _Decomposition(workarounds_for("fx_node_fix", ("onnx",), ctx.config.disable))
        token = _DECOMPOSITION_FIXES.set(state)
        ctx.stack.callback(_DECOMPOSITION_FIXES.reset, token)
        ctx.extras["onnx_decomposition"] = state

# ── Stage 3: FX node fixes ──
    def stage_fx_node_fixes(self, ctx: ExportContext) -> None:
        program = self.trace(ctx)
        fixes = workarounds_for("fx_node_fix", ("onnx",), ctx.config.disable)
        report = apply_fx_node_fixes(program.graph_module, fixes)
        ctx.report["fixes"].update(report.applied)

# ── Stage 4: ONNX translations ──
    def stage_onnx_translations(self, ctx: ExportContext) -> None:
        table = translation_table(ctx.config.disable, ctx.config.opset_version)  # type: ignore[attr-defined]
        ctx.extras["onnx_translations"] = sorted({fn.__name__ for fn in table.values()})
        ctx.extras["onnx_program"] = self._to_onnx(ctx, table)

# ── Stage 5: ONNX IR fixes ──
    def stage_onnx_ir_fixes(self, ctx: ExportContext) -> None:
        config: OnnxConfig = ctx.config  # type: ignore[assignment]
        fixes = ir_fixes(config.disable)
        program = ctx.extras["onnx_program"]
        applied = apply_ir_fixes(program.model, fixes)
        optimized, not_optimized_because, seconds = False, None, 0.0
        if not config.optimize:
            not_optimized_because = "OnnxConfig(optimize=False)"
        elif ctx.model_class in ONNX_DISABLE_OPTIMIZE:
            not_optimized_because = f"ONNX_DISABLE_OPTIMIZE[{ctx.model_class!r}]: {ONNX_DISABLE_OPTIMIZE[ctx.model_class]}"
        else:
            start = time.perf_counter()
            try:
                program.optimize()  # onnxscript's optimizer, what torch.onnx.export(optimize=True) runs
                optimized = True
            except Exception as exc:  # never lose the export: keep the unoptimized model, and say so
                failure = _failure_text(exc)
                warnings.warn(f"the onnxscript optimizer failed on {ctx.model_class} ({failure}); keeping the "
                              "unoptimized ONNX model (outputs are the same, it may run slower)",
                              OptimizerFallbackWarning, stacklevel=2)
                ctx.note(f"onnxscript optimizer failed ({failure}); the unoptimized model was kept")
                not_optimized_because = f"optimizer failed: {failure}"
                # The optimizer rewrites in place (it may have inlined functions before it crashed): re-export.
                program = self._to_onnx(ctx, translation_table(config.disable, config.opset_version))
                applied = apply_ir_fixes(program.model, fixes)
            seconds = time.perf_counter() - start
        ctx.extras["onnx_program"] = program
        model = program.model
        _stamp_metadata(model, ctx)
        runner = OnnxRunner.from_model(model, config.providers, ctx.extras["onnx_io"])
        ctx.extras["onnx_runner"] = runner
        ctx.extras["onnx_manifest"] = {
            "model_file": MODEL_FILE,
            "data_file": DATA_FILE,
            "opset": model.opset_imports.get("", None),
            "opset_requested": config.opset_version,
            "optimized": optimized,
            "not_optimized_because": not_optimized_because,
            "optimize_s": round(seconds, 4),
            "providers": list(config.providers),
            "node_count": node_count(model),
            "ir_fixes": applied,
            "translations": ctx.extras.get("onnx_translations", []),
            "fixes_after_decomposition": ctx.extras["onnx_decomposition"].report.applied
            if "onnx_decomposition" in ctx.extras else {},
            **ctx.extras["onnx_io"],
        }
        # The ONNX program's initializers are views of the torch weights: drop it, the runner's files are the artifact.
        ctx.extras.pop("onnx_program", None)

    # ── lowering ──────────────────────────────────────────────────────────────────────────────────────
    def _to_onnx(self, ctx: ExportContext, table: Mapping[Any, Callable[..., Any]]) -> Any:
        """``torch.onnx.export`` of ``ctx.program`` (unoptimized), with readable input and output names."""
        config: OnnxConfig = ctx.config  # type: ignore[assignment]
        io = _io_names(ctx)
        ctx.extras["onnx_io"] = io
        if "onnx_decomposition" in ctx.extras:  # count the fixes of this conversion only (a fallback converts again)
            ctx.extras["onnx_decomposition"].report.applied.clear()
        try:
            with _quiet_torch_onnx():
                program = torch.onnx.export(ctx.program, (), dynamo=True,
                                            custom_translation_table=dict(table) or None, optimize=False,
                                            opset_version=config.opset_version,
                                            output_names=[n for n in io["output_leaves"] if n is not None],
                                            verbose=False, report=False)
        except Exception as exc:
            # torch.onnx wraps the real failure (a missing op, a decomposition error) in a generic
            # ConversionError: lead with the innermost one, which names the op or node.
            raise OnnxConversionError(f"torch.onnx.export failed: {_failure_text(exc)}") from exc
        _check_opset(program.model, config.opset_version)
        _name_graph_inputs(program.model.graph, [n for n in io["input_leaves"] if n is not None])
        _name_graph_outputs(program.model.graph, [n for n in io["output_leaves"] if n is not None])
        return program

    # ── packaging ─────────────────────────────────────────────────────────────────────────────────────
    def package(self, ctx: ExportContext) -> ExportedModel:
        runner: OnnxRunner = ctx.extras["onnx_runner"]
        manifest = self.manifest(ctx, program_file=MODEL_FILE, onnx=ctx.extras["onnx_manifest"])
        components = {MODEL_FILE: runner.write_files, **self.components(ctx)}
        return ExportedModel(self.name, runner, manifest, components=components,
                             out_spec=ctx.program.call_spec.out_spec, reference=self.reference(ctx))

    @classmethod
    def backend_workarounds(cls) -> list[dict[str, str]]:
        """The ONNX translations and IR fixes, which live in this module's tables, not the kernel registries."""
        out = []
        for target, fn in _ONNX_TRANSLATION_TABLE.items():
            out.append({"kind": "translation", "name": f"{fn.__module__}.{getattr(fn, 'name', fn.__name__)} ({target})",
                        "summary": _first_doc_line(fn)})
        for fix in _IR_FIXES:
            out.append({"kind": "ir_fix", "name": f"{fix.__module__}.{fix.__name__}", "summary": _first_doc_line(fix)})
        return out

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any]) -> OnnxRunner:
        """Open ``model.onnx`` on ONNX Runtime with the providers it was exported for (those installed)."""
        register_transformers_pytrees()
        section = manifest.get("onnx", {})
        wanted = list(section.get("providers") or ["CPUExecutionProvider"])
        available = _available_providers()
        providers = [p for p in wanted if p in available]
        if not providers:
            warnings.warn(f"none of the providers this model was exported for ({', '.join(wanted)}) is "
                          f"available; running on CPUExecutionProvider", stacklevel=2)
            providers = ["CPUExecutionProvider"]
        return OnnxRunner(Path(path) / section.get("model_file", MODEL_FILE), providers, section)

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, UnsupportedOpsetError):
            return [f"export with opset_version={TORCHLIB_OPSET} (the default) or higher"]
        if "No ONNX function found" in text or "DispatchError" in text:
            return ["add an `_aten_<op>` translation to _ONNX_TRANSLATION_TABLE in hfexport_onnx/exporter_onnx.py, "
                    "or an @register_patch('onnx', ...) that avoids the op",
                    "see the full traceback above (the original error is chained)"]
        if isinstance(exc, OnnxSessionError):
            return ["try optimize=False (an optimizer rewrite may have produced the node), or another opset_version",
                    "if the op is missing from ONNX Runtime, add an `_aten_<op>` translation that avoids it"]
        return super().hints_for(stage, exc)


def _record_patches(ctx: ExportContext, report: Any) -> None:
    ctx.report["patches"].extend(r.as_dict() | {"path": p} for r, p in report.installed)
    ctx.report["skipped_patches"].extend(r.as_dict() | {"path": p, "reason": why} for r, p, why in report.skipped)


# ── the runner ─────────────────────────────────────────────────────────────────────────────────────────
def _first_doc_line(fn: Any) -> str:
    doc = (getattr(fn, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


class OnnxRunner:
    """Runs ``model.onnx`` on ONNX Runtime: flat input leaves in, flat output tensors out.

    Args:
        path: the ``model.onnx`` file (its weights beside it in ``model.onnx.data``).
        providers: execution providers, in priority order (default CPU).
        io: ``input_leaves`` (the graph input name of each flattened input leaf, ``None`` for a leaf baked into
            the program) and ``output_leaves`` (the graph output name of each output leaf, ``None`` where
            ``output_constants`` gives its value), as written in the manifest's ``onnx`` section.
        session_options: an ``onnxruntime.SessionOptions``; the default logs errors only.

    Raises:
        OnnxSessionError: ONNX Runtime cannot create a session; names the node and op it refused.
    """

    def __init__(self, path: str | Path, providers: Sequence[str] = ("CPUExecutionProvider",),
                 io: Mapping[str, Any] | None = None, session_options: Any = None):
        import onnxruntime

        self.path = Path(path)
        self.providers = list(providers)
        io = dict(io or {})
        self._cleanup: Any = None  # removes the temporary directory of an in-memory export
        if session_options is None:
            session_options = onnxruntime.SessionOptions()
            session_options.log_severity_level = 3
        try:
            self.session = onnxruntime.InferenceSession(str(self.path), session_options, providers=self.providers)
        except Exception as exc:
            raise OnnxSessionError(_explain_session_failure(exc, self.path, self.providers)) from exc
        graph_inputs = [i.name for i in self.session.get_inputs()]
        graph_outputs = [o.name for o in self.session.get_outputs()]
        self.input_leaves: list[str | None] = list(io.get("input_leaves") or graph_inputs)
        self.output_leaves: list[str | None] = list(io.get("output_leaves") or graph_outputs)
        self.output_constants: dict[str, Any] = dict(io.get("output_constants") or {})
        missing = sorted({n for n in self.input_leaves if n is not None} - set(graph_inputs))
        if missing:
            raise OnnxSessionError(f"{self.path} has no graph inputs {missing}; its inputs are {graph_inputs}")

    @classmethod
    def from_model(cls, model: ir.Model, providers: Sequence[str], io: Mapping[str, Any]) -> OnnxRunner:
        """Write ``model`` into a temporary directory owned by the runner and open a session on the file.

        Opening from a file (weights in ``model.onnx.data``) works past the 2 GB protobuf limit.
        """
        directory = tempfile.mkdtemp(prefix="hfexport-onnx-")
        path = Path(directory) / MODEL_FILE
        try:
            ir.save(model, path, external_data=DATA_FILE)
            runner = cls(path, providers, io)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        # The directory goes with the runner (and at interpreter exit at the latest).
        runner._cleanup = weakref.finalize(runner, shutil.rmtree, directory, ignore_errors=True)
        return runner

    @property
    def files(self) -> list[Path]:
        """``model.onnx`` and, when the model has weights, ``model.onnx.data``."""
        return [p for p in (self.path, self.path.with_name(self.path.name + ".data")) if p.exists()]

    def write_files(self, directory: Path) -> list[str]:
        """Copy the model files into ``directory`` (the artifact's staging directory); returns their names."""
        names = []
        for source in self.files:
            name = MODEL_FILE if source == self.path else DATA_FILE
            shutil.copyfile(source, Path(directory) / name)
            names.append(name)
        return names

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        """Run the top-level inputs ``args`` (signature order; pytrees allowed); returns the flat outputs."""
        leaves = pytree.tree_leaves(args)
        if len(leaves) != len(self.input_leaves):
            raise TypeError(f"expected {len(self.input_leaves)} input tensors after flattening, got {len(leaves)}")
        feed = {}
        for name, leaf in zip(self.input_leaves, leaves, strict=True):
            if name is None:
                continue
            if not isinstance(leaf, torch.Tensor):
                leaf = torch.as_tensor(leaf)
            feed[name] = leaf.detach().cpu().contiguous().numpy()
        names = [n for n in self.output_leaves if n is not None]
        values = dict(zip(names, self.session.run(names, feed), strict=True))
        out = []
        for i, name in enumerate(self.output_leaves):
            if name is None:
                out.append(self.output_constants.get(str(i)))
            else:
                out.append(torch.from_numpy(values[name]))
        return out


def _explain_session_failure(exc: BaseException, path: Path, providers: Sequence[str]) -> str:
    """The ORT error, led by the node and op it refused (looked up in the model when ORT names only one)."""
    text = str(exc).strip()
    nodes: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(Exception):
        model = ir.load(path)
        for graph in (model.graph, *model.functions.values()):
            for node in ir.traversal.RecursiveGraphIterator(graph):
                if node.name:
                    nodes[node.name] = (node.domain or "ai.onnx", node.op_type)
    culprit = None
    # ORT names the node like `Node (node_Foo_3)`, `node_Foo_3`, `[ShapeInferenceError] ... node: name` ...
    for match in re.finditer(r"[\"'(\s:=]([A-Za-z_][\w./:-]*)", text):
        if match.group(1) in nodes:
            culprit = match.group(1)
            break
    if culprit is None:  # an op that ORT does not know (it often names only the op)
        for name, (_domain, op_type) in nodes.items():
            if re.search(rf"\b{re.escape(op_type)}\b", text):
                culprit = name
                break
    where = "node ? (op ?)"
    if culprit is not None:
        domain, op_type = nodes[culprit]
        where = f"node {culprit!r} (op {op_type}, domain {domain})"
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"ONNX Runtime ({', '.join(providers)}) cannot create a session for {path.name}: {where}: {first}"


# ── names, metadata, opset ─────────────────────────────────────────────────────────────────────────────
def _readable(name: str, taken: set[str], default: str) -> str:
    if not name or name.replace(".", "").isdigit():
        name = f"{default}_{name.replace('.', '_')}" if name else default
    base, i = name, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _io_names(ctx: ExportContext) -> dict[str, Any]:
    """Readable graph input/output names for every flattened leaf (``None`` for leaves that are constants)."""
    from torch.export.graph_signature import ConstantArgument, TensorArgument

    program = ctx.program
    sig = program.graph_signature
    user_inputs = [s for s in sig.input_specs if s.kind.name == "USER_INPUT"]
    input_names, _, _ = flatten_with_names(dict(ctx.inputs))
    taken: set[str] = set()
    input_leaves: list[str | None] = []
    if len(input_names) != len(user_inputs):  # cannot happen for a traced signature; keep torch's names then
        input_names = [getattr(s.arg, "name", "") for s in user_inputs]
    for name, spec in zip(input_names, user_inputs, strict=True):
        input_leaves.append(_readable(name, taken, "input") if isinstance(spec.arg, TensorArgument) else None)
    out_spec = program.call_spec.out_spec
    # Tensor placeholders, not ints: cache types flatten by walking their tensor-valued attributes.
    placeholders = [torch.empty(0) for _ in range(out_spec.num_leaves)]
    output_names, _, _ = flatten_with_names(pytree.tree_unflatten(placeholders, out_spec))
    user_outputs = [s for s in sig.output_specs if s.kind.name == "USER_OUTPUT"]
    output_leaves: list[str | None] = []
    constants: dict[str, Any] = {}
    for i, (name, spec) in enumerate(zip(output_names, user_outputs, strict=True)):
        if isinstance(spec.arg, TensorArgument):
            output_leaves.append(_readable(name, taken, "output"))  # a bare tensor output is called "output"
        else:
            output_leaves.append(None)
            constants[str(i)] = spec.arg.value if isinstance(spec.arg, ConstantArgument) else None
    return {"input_leaves": input_leaves, "output_leaves": output_leaves, "output_constants": constants}


def _all_value_names(graph: ir.Graph) -> dict[str, ir.Value]:
    values: dict[str, ir.Value] = {}
    for v in (*graph.inputs, *graph.initializers.values()):
        if v.name:
            values[v.name] = v
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for v in node.outputs:
            if v.name:
                values[v.name] = v
    return values


def _rename(graph: ir.Graph, value: ir.Value, name: str) -> None:
    """Give ``value`` the name ``name``; another value already called so is renamed out of the way."""
    if value.name == name:
        return
    other = _all_value_names(graph).get(name)
    if other is not None and other is not value:
        other.name = f"{name}__{id(other):x}"
    value.name = name


def _name_graph_inputs(graph: ir.Graph, names: list[str]) -> None:
    if len(graph.inputs) != len(names):
        logger.warning("ONNX graph has %d inputs for %d tensor input leaves: keeping torch.onnx's input names",
                       len(graph.inputs), len(names))
        return
    for value, name in zip(graph.inputs, names, strict=True):
        _rename(graph, value, name)


def _name_graph_outputs(graph: ir.Graph, names: list[str]) -> None:
    """Name the outputs; one that is a graph input or repeats an earlier output goes through an ``Identity``."""
    if len(graph.outputs) != len(names):
        logger.warning("ONNX graph has %d outputs for %d tensor output leaves: keeping torch.onnx's output names",
                       len(graph.outputs), len(names))
        return
    seen: set[int] = set()
    for index, (value, name) in enumerate(zip(list(graph.outputs), names, strict=True)):
        if value.is_graph_input() or id(value) in seen or value.is_initializer():
            identity = ir.node("Identity", [value])
            out = identity.outputs[0]
            out.shape, out.type = value.shape, value.type
            graph.append(identity)
            graph.outputs[index] = value = out
        seen.add(id(value))
        _rename(graph, value, name)


def _stamp_metadata(model: ir.Model, ctx: ExportContext) -> None:
    """Namespaced ``metadata_props``: ``pkg.hfexport.*``."""
    from importlib import metadata

    model.metadata_props["pkg.hfexport.backend"] = "onnx"
    model.metadata_props["pkg.hfexport.model_class"] = ctx.model_class
    with contextlib.suppress(metadata.PackageNotFoundError):
        model.metadata_props["pkg.hfexport.version"] = metadata.version("hfexport-onnx")


def _check_opset(model: ir.Model, requested: int) -> None:
    """Raise :class:`UnsupportedOpsetError` when torch.onnx kept a higher opset than requested.

    torch.onnx writes opset 18 and converts down; when the converter fails it keeps 18 and only logs.
    """
    got = model.opset_imports.get("", requested)
    if got == requested:
        return
    needs: dict[str, int] = {}
    for graph in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if node.domain not in ("", "ai.onnx") or node.op_type in needs:
                continue
            try:
                onnx.defs.get_schema(node.op_type, max_inclusive_version=requested, domain="")
            except onnx.defs.SchemaError:
                with contextlib.suppress(onnx.defs.SchemaError):
                    first = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                                if s.name == node.op_type and s.domain == "")
                    needs[node.op_type] = first
    if needs:
        lowest = max(needs.values())
        ops = ", ".join(f"{op_type} (from opset {v})" for op_type, v in sorted(needs.items(), key=lambda kv: -kv[1]))
        detail = f"it uses {ops}, which opset {requested} does not have; the lowest opset it fits is {lowest}"
    else:
        detail = f"the ONNX version converter could not convert it from opset {got}"
    raise UnsupportedOpsetError(f"opset_version={requested} is lower than this graph needs: {detail}. Use "
                                f"opset_version >= {max(needs.values(), default=got)} (the default, "
                                f"{TORCHLIB_OPSET}, is what torch.onnx writes natively)")


def node_count(model: ir.Model) -> int:
    """Nodes in the main graph, its subgraphs and every function."""
    return sum(sum(1 for _ in ir.traversal.RecursiveGraphIterator(g)) for g in (model.graph, *model.functions.values()))


def _failure_text(exc: BaseException) -> str:
    """``Type: message`` of the innermost cause (the optimizer wraps the real error in a PassError)."""
    chain = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        # what a traceback shows as "the above exception was the direct cause of / during handling of"
        exc = exc.__cause__ if exc.__cause__ is not None else (  # type: ignore[assignment]
            None if exc.__suppress_context__ else exc.__context__)
    root = chain[-1]
    first = str(root).strip().splitlines()[0][:200] if str(root).strip() else ""
    outer = f"{type(chain[0]).__name__} ← " if len(chain) > 1 else ""
    return f"{outer}{type(root).__name__}: {first}"


class _DropNoise(logging.Filter):
    """torch.onnx logs 'torchvision is not installed. Skipping torchvision::nms' (4 lines) on every export."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torchvision is not installed" not in record.getMessage()


@contextlib.contextmanager
def _quiet_torch_onnx() -> Iterator[None]:
    noise = _DropNoise()
    loggers = [logging.getLogger("torch.onnx._internal.exporter._registration")]
    for lg in loggers:
        lg.addFilter(noise)
    try:
        with warnings.catch_warnings():
            # torch.onnx re-warns about things the exporter already handled (deprecated dynamic_axes, ...).
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        for lg in loggers:
            lg.removeFilter(noise)


# ── Torch patches (stage 1) ────────────────────────────────────────────────────────────────────────────
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


# ── ONNX patches (stage 2) ─────────────────────────────────────────────────────────────────────────────
@register_patch("onnx.decomposition", "torch.onnx._internal.exporter._fx_passes.decompose_with_registry")
def _patch_decompose_with_registry(original: Any) -> Any:
    """Re-run the ONNX FX node fixes on the program that ``run_decompositions`` returns inside torch.onnx.

    **Why**: ``torch.onnx.export`` decomposes the program again (``_core._prepare_exported_program_for_export``
    → ``_fx_passes.decompose_with_registry``, its only call of ``run_decompositions``) and then runs its
    type-promotion pass on the result. Some patterns exist only in the decomposed graph and break that pass:
    ``aten.rsub.Scalar(int_tensor, 1.0)`` becomes ``aten.sub.Tensor(1.0, int_tensor)``, which fails with
    ``Cannot find a compatible OpOverload for aten.sub`` (c18 traced without ``_patch_tensor_rsub``). Running
    the FX node fixes between the two steps lets ``_fix_sub_scalar_int_tensor`` rewrite it. The fixes to run
    come from the export (``disable`` respected) through a context variable.
    **Upstream**: pytorch/pytorch#194381 (the pattern this hook exists for); the hook is a private torch.onnx
    function (``torch/onnx/_internal/exporter/_fx_passes.py``).
    **Remove when**: torch.onnx offers a post-decomposition hook, or no FX node fix needs the decomposed
    graph. If torch moves the call, hook the new caller of ``ExportedProgram.run_decompositions`` in ``_core.py``.
    """

    def decompose_with_registry(exported_program: Any, registry: Any, *args: Any, **kwargs: Any) -> Any:
        program = original(exported_program, registry, *args, **kwargs)
        state = _DECOMPOSITION_FIXES.get()
        if state is not None and state.fixes:
            apply_fx_node_fixes(program.graph_module, state.fixes, state.report)
        return program

    return decompose_with_registry


# ── FX node fixes (stage 3; re-run after decomposition by stage 2) ─────────────────────────────────────
@register_fx_node_fix("onnx")
def _fix_contiguous(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``aten.contiguous(x)`` by ``aten.clone(x, memory_format=torch.contiguous_format)``.

    **Why**: T5 (``attn_output.transpose(1, 2).contiguous()`` then ``reshape``) fails in torch.onnx's
    decomposition: ``run_decompositions`` runs under ``backed_size_oblivious=True``, decides that the
    ``contiguous()`` is a no-op, and the following reshape becomes a ``view``: ``ValueError: Cannot view a
    tensor with shape torch.Size([s11, s53, 4, 8]) and strides (32*s53, 8, 8*s53, 1) as a tensor with shape
    (s11, s53, 32)!``. An explicit clone always yields a contiguous tensor (same values; free in ONNX).
    **Upstream**: pytorch/pytorch#136543, pytorch/pytorch#141107, pytorch/pytorch#139508.
    **Remove when**: the tiny T5 exports with ``disable=("_fix_contiguous",)``.
    """
    if node.op != "call_function" or node.target is not aten.contiguous.default:
        return False
    if node.kwargs.get("memory_format", torch.contiguous_format) is not torch.contiguous_format:
        return False
    node.target = aten.clone.default
    node.kwargs = {"memory_format": torch.contiguous_format}
    return True


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


# ── ONNX translations (stage 4) ────────────────────────────────────────────────────────────────────────
# Plain Python functions over onnxscript ops (traced, not scripted); torch.onnx wraps them and they take
# precedence over torchlib's functions for the same overload.
def _topk_all(self: Any, dim: int, descending: bool) -> Any:
    # TopK(sorted=1) puts the lower index first among equal values: a stable sort, in both directions.
    size = op.Gather(op.Shape(self), op.Constant(value_ints=[dim]), axis=0)
    return op.TopK(self, size, axis=dim, largest=1 if descending else 0, sorted=1)


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


def _aten_gelu(self: Any, approximate: str = "none") -> Any:
    """``aten.gelu(x)`` → ``(x * 0.5) * (1 + Erf(x / sqrt(2)))``, the form ONNX Runtime fuses into one ``Gelu``.

    **Why**: at opsets below 20 (no ONNX ``Gelu``) torchlib writes ``x * (0.5 * (1 + Erf(x / sqrt(2))))``.
    ONNX Runtime's ``GeluFusion`` does not match that multiplication order, so every BERT-style MLP runs five
    element-wise kernels over its ``[batch, seq, intermediate]`` activation instead of one (about 8% of
    all-MiniLM-L6-v2's CPU time at batch 8). Same formula, other association: equal within float rounding.
    ``approximate="tanh"`` keeps torchlib's lowering (no CPU fusion matches either order); from opset 20 on,
    torchlib emits ONNX ``Gelu`` and this translation is not used.
    **Upstream**: microsoft/onnxscript#2132 (review: the dynamo graph's ``Mul(0.5)`` order defeats ORT's Gelu
    fusions), microsoft/onnxscript#2495 (an Erf-Gelu rewrite rule, not in the default optimizer),
    microsoft/onnxruntime#3148 (the patterns ``GeluFusion`` matches).
    **Remove when**: torchlib's opset-18 gelu uses a fusable order, or the default opset is 20 or higher.
    """
    from onnxscript.function_libs.torch_lib.ops.nn import aten_gelu as torchlib_gelu

    if approximate != "none":
        return torchlib_gelu(self, approximate=approximate)
    half = op.Mul(self, op.CastLike(op.Constant(value_float=0.5), self))
    erf = op.Erf(op.Div(self, op.CastLike(op.Constant(value_float=1.4142135623730951), self)))
    return op.Mul(half, op.Add(erf, op.CastLike(op.Constant(value_float=1.0), self)))


_ONNX_TRANSLATION_TABLE: dict[Any, Callable[..., Any]] = {
    aten.sort.stable: _aten_sort_stable,
    aten.scaled_dot_product_attention.default: _aten_scaled_dot_product_attention,
    aten.gelu.default: _aten_gelu,
}
# Translations that only apply below an opset (torchlib has a better lowering from there on).
_TRANSLATION_BELOW_OPSET: dict[Callable[..., Any], int] = {_aten_gelu: 20}


def _disabled(func: Callable[..., Any], disabled: Iterable[str]) -> bool:
    off = set(disabled)
    return func.__name__ in off or f"{func.__module__}.{func.__qualname__}" in off


def translation_table(disabled: Iterable[str] = (), opset_version: int = TORCHLIB_OPSET) -> dict[Any, Callable[..., Any]]:
    """``_ONNX_TRANSLATION_TABLE`` minus the entries whose function name is in ``disabled`` and those that do
    not apply at ``opset_version``."""
    disabled = tuple(disabled)
    return {k: fn for k, fn in _ONNX_TRANSLATION_TABLE.items()
            if not _disabled(fn, disabled) and opset_version < _TRANSLATION_BELOW_OPSET.get(fn, 10**6)}


# ── ONNX IR fixes (stage 5) ────────────────────────────────────────────────────────────────────────────
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


_IR_FIXES: list[Callable[[ir.Graph | ir.Function], int]] = [_fix_ir_topk_sorted]


def ir_fixes(disabled: Iterable[str] = ()) -> list[Callable[[ir.Graph | ir.Function], int]]:
    """``_IR_FIXES`` minus those whose function name is in ``disabled``."""
    disabled = tuple(disabled)
    return [fix for fix in _IR_FIXES if not _disabled(fix, disabled)]


def apply_ir_fixes(model: ir.Model, fixes: Iterable[Callable[[ir.Graph | ir.Function], int]]) -> dict[str, int]:
    """Apply each ``_fix_ir_*`` to the main graph and every function; returns ``{name: rewrites}`` (fired only)."""
    applied: dict[str, int] = {}
    for fix in fixes:
        n = sum(int(fix(g) or 0) for g in (model.graph, *model.functions.values()))
        if n:
            applied[fix.__name__] = n
    return applied
