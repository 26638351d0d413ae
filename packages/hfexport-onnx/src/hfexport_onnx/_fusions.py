"""ONNX Runtime fusions of an exported graph (``OnnxConfig(ort_fusions="cpu")``): stage 5's step ``onnxscript ort_fusions``.

onnxscript's rewriter (:func:`onnxscript.rewriter.ort_fusions.optimize_for_ort`) rewrites the optimized graph into
ONNX Runtime's own ops (the ``com.microsoft`` domain, and ``SimplifiedLayerNormalization``) wherever its patterns
match: attention (``MultiHeadAttention``, ``Attention``, ``GroupQueryAttention``), layer norms
(``SkipLayerNormalization``, ``SimplifiedLayerNormalization``), ``Gelu``/``BiasGelu``, ``RotaryEmbedding``. hfexport
writes no fusion pattern of its own. For the CPU provider it then writes back, as the ONNX ops they fuse, the fused
ops whose ONNX Runtime CPU kernel is slower than those ops (:data:`CPU_SLOWER_THAN_UNFUSED`), and the runner has
ONNX Runtime's session leave them unfused (:data:`CPU_SESSION_DISABLED_OPTIMIZERS`).

The step never costs a correct export: a class listed in :data:`ORT_FUSIONS_DISABLE`, a fusion that raises, or a fused
graph that ONNX Runtime refuses falls back to the unfused model, with a note in the manifest and an
:class:`OrtFusionFallbackWarning` that names the cause. The fused model is the file the runner runs, so the export's
verification against eager PyTorch checks it like any other (a mismatch raises ``VerificationError``: add the class
to ``ORT_FUSIONS_DISABLE`` with the upstream issue, or export with ``ort_fusions=None``).
"""

from __future__ import annotations

import collections
import time
import warnings
from collections.abc import Callable
from typing import Any

import onnx_ir as ir

from hfexport.plugin import ExportContext

from ._errors import OnnxSessionError, OptimizerFallbackWarning, failure_text
from ._model import TORCHLIB_OPSET, node_count, stamp_metadata

__all__ = ["CPU_SESSION_DISABLED_OPTIMIZERS", "CPU_SLOWER_THAN_UNFUSED", "ORT_FUSIONS_DISABLE", "ORT_FUSION_TARGETS",
           "OrtFusionFallbackWarning", "check_ort_fusions", "fuse_and_open", "fuse_for_ort", "fused_op_counts",
           "drop_identity_reshapes", "feed_packed_qkv", "pack_shared_input_matmuls", "repair_batch_transposes", "undo_skip_norms"]

# The execution providers hfexport fuses for (the value of ``OnnxConfig.ort_fusions``).
ORT_FUSION_TARGETS: tuple[str, ...] = ("cpu",)

# Model class -> the upstream issue that makes ONNX Runtime fusions give it a wrong result (or no session). Such a
# class is exported unfused, with a warning naming the issue. ``optimize_fallback=False`` fuses it anyway (how the
# sweep re-checks an entry: OnnxExporter.recheck_options). Expected to stay short; every entry names its issue.
ORT_FUSIONS_DISABLE: dict[str, str] = {}

# Fused ops whose ONNX Runtime CPU kernel is slower than the ONNX ops it replaces, measured on onnxruntime 1.32,
# 1 intra-op thread (AMD EPYC, AVX-512), one op on [1, 128, hidden] inputs (median µs; fused / Add + norm):
#   SkipLayerNormalization            hidden 384: 254 / 39, 768: 501 / 68, [1, 32, 2048]: 335 / 48
#   SkipSimplifiedLayerNormalization  hidden 384:  58 / 26, 768: 110 / 44, [1, 32, 2048]:  75 / 32
# and equal at one row (decoding). On all-MiniLM-L6-v2 (1 x 128) they cost 7% of the whole run. No upstream
# issue found; re-measure with ``benchmarks/bench_onnx.py`` and drop an entry when its kernel is as fast.
CPU_SLOWER_THAN_UNFUSED: dict[str, str] = {
    "SkipLayerNormalization": "LayerNormalization",
    "SkipSimplifiedLayerNormalization": "SimplifiedLayerNormalization",
}
# ONNX Runtime's own session-level fusion that would turn the Add + norm written back into the slow ops again
# (it fuses both LayerNormalization and SimplifiedLayerNormalization); the runner passes it as
# ``InferenceSession(disabled_optimizers=...)``. A session opened without it computes the same values, slower.
CPU_SESSION_DISABLED_OPTIMIZERS: tuple[str, ...] = ("SkipLayerNormFusion",)

_MS = "com.microsoft"


class OrtFusionFallbackWarning(OptimizerFallbackWarning):
    """ONNX Runtime fusions were not applied to a model (a listed class, a fusion that raised, a fused graph ONNX
    Runtime refused); the unfused model was exported, with the same outputs."""


def check_ort_fusions(value: Any) -> str | None:
    """``OnnxConfig.ort_fusions`` normalized: a provider name of :data:`ORT_FUSION_TARGETS`, or ``None`` (off)."""
    if value is None or value is False:
        return None
    if isinstance(value, str) and value in ORT_FUSION_TARGETS:
        return value
    raise ValueError(f"ort_fusions must name the ONNX Runtime execution provider to fuse for, one of "
                     f"{', '.join(map(repr, ORT_FUSION_TARGETS))}, or be None (or False) for no fusions; got {value!r}"
                     f" ({type(value).__name__})")


def fused_op_counts(model: ir.Model) -> dict[str, int]:
    """ONNX Runtime's own ops in ``model`` (main graph, subgraphs, functions): ``{"com.microsoft.Attention": 6}``."""
    counts: collections.Counter[str] = collections.Counter()
    for graph in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if node.domain == _MS or (node.domain in ("", "ai.onnx") and node.op_type == "SimplifiedLayerNormalization"):
                counts[f"{node.domain or 'ai.onnx'}.{node.op_type}"] += 1
    return dict(sorted(counts.items()))


def undo_skip_norms(model: ir.Model, op_types: Any = tuple(CPU_SLOWER_THAN_UNFUSED)) -> dict[str, int]:
    """Write each ``SkipLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` of ``op_types`` in the main graph
    back as ``Add`` (input + bias, then + skip) and ``LayerNormalization`` / ``SimplifiedLayerNormalization`` over the
    last axis (``stash_type=1``), the ops onnxscript fused. A node whose mean or inverse standard deviation is used
    stays. Returns ``{op type: nodes rewritten}``."""
    done: collections.Counter[str] = collections.Counter()
    graph = model.graph
    for node in list(graph):
        if node.domain != _MS or node.op_type not in op_types:
            continue
        if any(v.uses() or v.is_graph_output() for v in node.outputs[1:3]):  # mean / inv_std_var used: keep it
            continue
        simplified = node.op_type == "SkipSimplifiedLayerNormalization"
        inputs = [*node.inputs, None, None, None]
        x, skip, gamma = inputs[:3]
        beta, bias = (None, inputs[3]) if simplified else (inputs[3], inputs[4])
        # input + bias (a Linear's), then + skip: the order of the graph onnxscript fused, in the common case
        new = [ir.node("Add", [x, bias])] if bias is not None else []
        new.append(ir.node("Add", [new[-1].outputs[0] if new else x, skip]))
        total = new[-1].outputs[0]
        norm_inputs = [total, gamma] + ([] if simplified or beta is None else [beta])
        attributes = {"axis": -1, "epsilon": node.attributes.get_float("epsilon", 1e-12), "stash_type": 1}
        new.append(ir.node(CPU_SLOWER_THAN_UNFUSED[node.op_type], norm_inputs, attributes=attributes))
        total.type, total.shape = node.outputs[0].type, node.outputs[0].shape
        old_values, new_values = [node.outputs[0]], [new[-1].outputs[0]]
        sum_out = node.outputs[3] if len(node.outputs) > 3 else None
        if sum_out is not None and (sum_out.uses() or sum_out.is_graph_output()):
            old_values.append(sum_out)
            new_values.append(total)
        ir.convenience.replace_nodes_and_values(graph, node, [node], new, old_values, new_values)
        done[node.op_type] += 1
    return dict(done)


def pack_shared_input_matmuls(model: ir.Model) -> int:
    """Join the ``MatMul`` nodes that multiply one input by 2-D constant weights (a decoder layer's query, key and
    value projections; its gate and up projections) into one ``MatMul`` over the weights concatenated along the
    output dim, then ``Split``: one GEMM launch where there were three, as ONNX Runtime GenAI's model builder writes
    ``qkv_proj``. Each weight is still stored once. Returns the number of ``MatMul`` nodes removed.

    Only weights that nothing else reads, of one dtype and input dim, in the main graph; the outputs' values are the
    same (each output column is the same dot product)."""
    import numpy as np

    graph = model.graph
    groups: dict[int, list[ir.Node]] = collections.defaultdict(list)
    graph_outputs = {id(v) for v in graph.outputs}
    for node in graph:
        if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2 or node.inputs[0] is None:
            continue
        weight = node.inputs[1]
        if weight is None or weight.const_value is None or not weight.is_initializer() \
                or len(weight.const_value.shape) != 2 or len(weight.uses()) != 1 or id(node.outputs[0]) in graph_outputs:
            continue
        groups[id(node.inputs[0])].append(node)
    removed = 0
    for nodes in groups.values():
        weights = [n.inputs[1] for n in nodes]
        if len(nodes) < 2 or len({(w.const_value.dtype, w.const_value.shape[0]) for w in weights}) != 1:
            continue
        parts = [w.const_value for w in weights]
        name = "_".join(w.name for w in weights[:1]) + f"_packed{len(weights)}"
        tensor = _JoinedTensor(parts, name)
        packed = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype),
                          const_value=tensor)
        graph.register_initializer(packed)
        first = nodes[0]
        matmul = ir.node("MatMul", [first.inputs[0], packed])
        source = first.inputs[0]
        matmul.outputs[0].type = first.outputs[0].type or packed.type
        if source.shape is not None:
            matmul.outputs[0].shape = ir.Shape([*source.shape[:-1], packed.shape[1]])
        sizes = ir.Value(name=name + "_sizes", const_value=ir.tensor(np.array([t.shape[1] for t in parts],
                                                                                 dtype=np.int64), name=name + "_sizes"))
        graph.register_initializer(sizes)
        split = ir.node("Split", [matmul.outputs[0], sizes], attributes={"axis": -1}, num_outputs=len(nodes))
        graph.insert_before(first, [matmul, split])
        for node, output in zip(nodes, split.outputs, strict=True):
            output.shape, output.type = node.outputs[0].shape, node.outputs[0].type
            ir.convenience.replace_all_uses_with(node.outputs[0], output)
            graph.remove(node, safe=True)
        for weight in weights:
            del graph.initializers[weight.name]
        removed += len(nodes) - 1
    return removed


class _JoinedTensor(ir.LazyTensor):
    """The 2-D tensors ``parts`` joined along dim 1, never held whole while the runner writes ``model.onnx.data``
    (``ir.external_data.unload_from_model`` calls :meth:`tofile`): written a block of rows at a time (about 1 MiB).
    Its parts are views of the model's parameters (the optimizer's folded transposes); reading its values
    (``numpy()``, ``tobytes()``) joins them each time, as an ``ir.LazyTensor`` does. Joined when packed, every
    layer's query-key-value and gate-up copies were 0.33x the weights of a 398 MB Llama, held until the file was
    written."""

    __slots__ = ("_parts",)
    BLOCK_BYTES = 1 << 20

    def __init__(self, parts: list[Any], name: str):
        self._parts = parts
        shape = ir.Shape([parts[0].shape[0], sum(part.shape[1] for part in parts)])
        super().__init__(self._join, dtype=parts[0].dtype, shape=shape, name=name)

    def _join(self) -> ir.Tensor:
        import numpy as np

        return ir.tensor(np.concatenate([part.numpy() for part in self._parts], axis=1), name=self.name)

    def tofile(self, file: Any) -> None:
        import numpy as np

        arrays = [part.numpy() for part in self._parts]
        if any(array.dtype.itemsize * 8 != self.dtype.bitwidth for array in arrays):  # sub-byte types: packed whole
            super().tofile(file)
            return
        rows = int(self.shape[0])
        step = max(1, self.BLOCK_BYTES // max(1, self.nbytes // max(rows, 1)))
        for first in range(0, rows, step):
            block = np.concatenate([array[first:first + step] for array in arrays], axis=1)
            if block.dtype.byteorder == ">":  # ONNX's byte order is little-endian
                block = block.byteswap().view(block.dtype.newbyteorder("<"))
            file.write(block.reshape(-1).view(np.uint8).data)


def _is_identity_reshape(node: ir.Node) -> bool:
    """A ``Reshape`` whose output has its input's shape: its constant target copies (0) or repeats each known dim,
    with at most one -1 for the rest."""
    source, target = node.inputs[0].shape, node.inputs[1].const_value if len(node.inputs) > 1 else None
    if source is None or target is None:
        return False
    dims = [int(d) for d in target.numpy().reshape(-1).tolist()]
    if len(dims) != len(source) or (node.attributes.get_int("allowzero", 0) and 0 in dims) or dims.count(-1) > 1:
        return False
    return all(d in (0, -1) or (isinstance(s, int) and s == d) for d, s in zip(dims, source, strict=True))


def _same_shape(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    """Both shapes known dim by dim (ints, or named symbolic dims: one name is one size) and equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all((isinstance(x, int) and x == y) or (not isinstance(x, int) and not isinstance(y, int)
                                                   and x.value is not None and x.value == y.value)
               for x, y in zip(a, b, strict=True))


def drop_identity_reshapes(model: ir.Model) -> int:
    """Remove the ``Reshape`` nodes whose output has their input's shape (a ``view`` to ``[batch, seq, heads, dim]``
    and back, folded by the optimizer into one reshape to ``[batch, -1, hidden]``): ONNX Runtime runs each one (4 per
    decoder layer around its attention). Shape inference leaves the outputs of ONNX Runtime's ops unknown; two keep
    a known shape and type: a ``RotaryEmbedding``'s output has its input's, a ``GroupQueryAttention``'s its query's
    (``[batch, seq, heads * dim]``, unpacked). Returns how many went."""
    graph = model.graph
    for node in graph:  # in topological order: a rotary's shape reaches the attention after it
        if node.domain != _MS or node.outputs[0].shape is not None or node.inputs[0] is None \
                or node.inputs[0].shape is None:
            continue
        if node.op_type == "RotaryEmbedding" or (node.op_type == "GroupQueryAttention" and len(node.inputs) > 2
                                                 and node.inputs[1] is not None):
            node.outputs[0].shape = node.inputs[0].shape
            if node.outputs[0].type is None:
                node.outputs[0].type = node.inputs[0].type
    import onnx_ir.passes.common as common_passes

    graph_outputs = {id(v) for v in graph.outputs}
    dropped = 0
    for node in list(graph):
        if node.op_type != "Reshape" or node.domain != "" or node.inputs[0] is None \
                or id(node.outputs[0]) in graph_outputs:
            continue
        # a chain of reshapes that ends at its start's shape (to [batch, seq, heads, dim] and back) is one no-op
        source = _through_reshapes(node.inputs[0])
        if _same_shape(source.shape, node.outputs[0].shape) and source.dtype == node.outputs[0].dtype:
            ir.convenience.replace_all_uses_with(node.outputs[0], source)
        elif _is_identity_reshape(node):
            ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])
        else:
            continue
        dropped += 1
    if dropped:
        common_passes.RemoveUnusedNodesPass()(model)
    return dropped


def _through_reshapes(value: ir.Value) -> ir.Value:
    """The value a chain of ``Reshape`` nodes starts from."""
    while value.producer() is not None and value.producer().op_type == "Reshape" and value.producer().domain == "":
        value = value.producer().inputs[0]
    return value


def feed_packed_qkv(model: ir.Model) -> int:
    """Hand each ``GroupQueryAttention`` whose query, key and value are the three parts of one packed projection
    (:func:`pack_shared_input_matmuls`: ``Split`` of one ``MatMul``, each part reshaped to ``[batch, seq, heads *
    dim]`` and back) that projection itself, with no key and value: the kernel's packed-QKV form, as ONNX Runtime
    GenAI writes it. The ``Split`` and the reshapes go. Returns the number of attention nodes changed."""
    import onnx_ir.passes.common as common_passes

    changed = 0
    for node in model.graph:
        if node.op_type != "GroupQueryAttention" or node.domain != _MS or len(node.inputs) < 3:
            continue
        parts = [_through_reshapes(v) if v is not None else None for v in node.inputs[:3]]
        split = parts[0].producer() if parts[0] is not None else None
        if split is None or split.op_type != "Split" or len(split.outputs) != 3 \
                or [p for p in parts] != list(split.outputs):
            continue
        axis = split.attributes.get_int("axis", 0)
        packed = split.inputs[0]
        if packed.shape is None or axis not in (-1, len(packed.shape) - 1) or len(packed.shape) != 3 \
                or any(v.shape is None or len(v.shape) != 3 or v.shape[-1] != p.shape[-1]
                       for v, p in zip(node.inputs[:3], parts, strict=True)):
            continue
        node.replace_input_with(0, packed)
        node.replace_input_with(1, None)
        node.replace_input_with(2, None)
        changed += 1
    if changed:
        common_passes.RemoveUnusedNodesPass()(model)
    return changed


def repair_batch_transposes(model: ir.Model) -> int:
    """Give every ``FusedMatMul`` whose ``transBatchA``/``transBatchB`` ONNX Runtime would refuse an explicit
    ``Transpose`` instead; returns the number of inputs repaired.

    **Why**: onnxscript's ``fused_matmul_rule_sets`` (microsoft/onnxscript#2331) fold a ``Transpose`` that moves the
    first dim to the second-to-last position into ``transBatchA``/``transBatchB`` without checking the other input's
    rank, but ONNX Runtime's CPU kernel takes a batch transpose only when both inputs have the same rank >= 3
    (``matmul_helper.h``: "Two inputs should have same rank and rank >= 3 if transBatchA or transBatchB is true"). The
    fused model then fails on every call (SigLIP's vision tower, XLNet's relative attention in the ONNX sample
    sweep). ``transBatch`` on an input of rank ``n`` is the permutation ``[1, ..., n - 2, 0, n - 1]``, so that input
    gets that ``Transpose`` and the flag goes back to 0 (``transA``/``transB`` and ``alpha`` stay): the same values,
    MatMul's broadcasting rules. Inputs of unknown rank are left as they are.
    **Remove when**: onnxscript checks the ranks before folding (its rules are unchanged on main).
    """
    repaired = 0
    for node in list(model.graph):
        if node.domain != _MS or node.op_type != "FusedMatMul" or len(node.inputs) < 2:
            continue
        ranks = [len(v.shape) if v is not None and v.shape is not None else None for v in node.inputs[:2]]
        if None in ranks or (ranks[0] == ranks[1] and ranks[0] >= 3):
            continue  # unknown ranks, or a batch transpose ONNX Runtime takes
        for index, flag in enumerate(("transBatchA", "transBatchB")):
            if not node.attributes.get_int(flag, 0):
                continue
            rank = ranks[index]
            perm = [*range(1, rank - 1), 0, rank - 1]
            transpose = ir.node("Transpose", [node.inputs[index]], attributes={"perm": perm})
            model.graph.insert_before(node, transpose)
            node.replace_input_with(index, transpose.outputs[0])
            node.attributes[flag] = ir.AttrInt64(flag, 0)
            repaired += 1
    return repaired


def fuse_for_ort(model: ir.Model, target: str = "cpu", *, debug: bool = False) -> dict[str, Any]:
    """Fuse ``model`` in place for ONNX Runtime's ``target`` provider; returns the report (the manifest's
    ``onnx.fusions``).

    Args:
        model: an optimized model (the onnxscript optimizer has run on it).
        target: a provider of :data:`ORT_FUSION_TARGETS`.
        debug: onnxscript's pattern-matching tracer (prints why each rule did not match).

    Returns:
        ``fired`` (onnxscript's count of each fusion that matched; some are steps of a later one: ``sdpa`` becomes
        ``MultiHeadAttention`` through ``mha*`` or ``sdpa_via_mha``, and ``rotary_embedding`` is inlined back
        unless ``cos_sin_cache`` fires too), ``undone`` (fused ops written back for the provider, and the batch
        transposes ONNX Runtime refuses, written as ``Transpose``: :func:`repair_batch_transposes`), ``ops`` (ONNX
        Runtime's ops in the result: what the file holds), ``nodes_before``/``nodes_after``,
        ``session_disabled_optimizers`` (for the runner) and ``seconds``.
    """
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    start = time.perf_counter()
    before = node_count(model)
    fused, fired = optimize_for_ort(model, target, debug=debug)
    if fused is not model:  # onnxscript rewrites in place and returns the model: a copy would lose the caller's
        raise RuntimeError("onnxscript's optimize_for_ort returned another model than it was given")
    undone = undo_skip_norms(model) if target == "cpu" else {}
    packed = pack_shared_input_matmuls(model)
    if packed:
        fired = {**fired, "packed_matmuls": packed, "packed_qkv_attention": feed_packed_qkv(model)}
    fired = {**fired, "identity_reshapes": drop_identity_reshapes(model)}
    repaired = repair_batch_transposes(model)
    if repaired:
        undone = {**undone, "FusedMatMul transBatch (as Transpose)": repaired}
    return {"target": target, "applied": True, "not_fused_because": None,
            "fired": {name: count for name, count in fired.items() if count},
            "undone": undone, "ops": fused_op_counts(model), "nodes_before": before, "nodes_after": node_count(model),
            "session_disabled_optimizers": list(CPU_SESSION_DISABLED_OPTIMIZERS) if target == "cpu" else [],
            "seconds": round(time.perf_counter() - start, 4)}


def _not_fused(target: str | None, why: str, nodes: int) -> dict[str, Any]:
    return {"target": target, "applied": False, "not_fused_because": why, "fired": {}, "undone": {}, "ops": {},
            "nodes_before": nodes, "nodes_after": nodes, "session_disabled_optimizers": [], "seconds": 0.0}


def _fall_back(ctx: ExportContext, target: str, why: str, nodes: int) -> dict[str, Any]:
    warnings.warn(f"ONNX Runtime fusions ({target}) were not applied to {ctx.model_class}: {why}; exporting the "
                  "unfused model (same outputs, it may run slower). Export with ort_fusions=None to skip them",
                  OrtFusionFallbackWarning, stacklevel=4)
    ctx.note(f"ONNX Runtime fusions ({target}) not applied: {why}; the unfused model was exported")
    return _not_fused(target, why, nodes)


def fuse_and_open(ctx: ExportContext, model: ir.Model, unfused: Callable[[], ir.Model],
                  open_runner: Callable[[ir.Model, dict[str, Any]], Any], *, target: str | None,
                  not_optimized_because: str | None, strict: bool = False) -> tuple[ir.Model, Any, dict[str, Any]]:
    """Stage 5's last steps: ``onnxscript ort_fusions`` on ``model`` (unless off, not optimized, listed in
    :data:`ORT_FUSIONS_DISABLE` or below opset 18), then ``onnxruntime.InferenceSession`` on the result.

    A fusion that raises, or a fused model that ONNX Runtime refuses, is replaced by ``unfused()`` (the export
    again, without fusions): the model is rewritten in place and may be half fused. ``strict`` (the config's
    ``optimize_fallback=False``) fuses a listed class too and raises instead of falling back.

    Returns:
        ``(the model the runner runs, the runner, the fusion report)``.
    """
    nodes = node_count(model)
    opset = model.opset_imports.get("", TORCHLIB_OPSET)
    if target is None:
        report = _not_fused(None, "OnnxConfig(ort_fusions=None)", nodes)
    elif not_optimized_because is not None:  # the fusions run onnxscript's optimizer: not where it was not wanted
        report = _not_fused(target, f"not optimized ({not_optimized_because})", nodes)
    elif opset < TORCHLIB_OPSET:  # microsoft/onnxscript#2260: the fusions assume the opset torch.onnx writes
        report = _not_fused(target, f"opset {opset} < {TORCHLIB_OPSET} (microsoft/onnxscript#2260: the fusions "
                                    f"have no opset guards)", nodes)
    elif ctx.model_class in ORT_FUSIONS_DISABLE and not strict:
        report = _fall_back(ctx, target, f"ORT_FUSIONS_DISABLE[{ctx.model_class!r}]: "
                                         f"{ORT_FUSIONS_DISABLE[ctx.model_class]}", nodes)
    else:
        failure = None
        with ctx.step("onnxscript ort_fusions"):  # the failure is caught inside: the step did not fail the export
            try:
                report = fuse_for_ort(model, target)
            except Exception as exc:
                if strict:
                    raise
                failure = failure_text(exc)
        if failure is not None:
            model = unfused()
            report = _fall_back(ctx, target, f"a fusion failed ({failure})", node_count(model))
    stamp_metadata(model, ctx.model_class)
    with ctx.step("onnxruntime.InferenceSession"):
        try:
            return model, open_runner(model, report), report
        except OnnxSessionError as exc:
            if not report["applied"] or strict:
                raise
            refused = str(exc).splitlines()[0]
    model = unfused()
    report = _fall_back(ctx, target or "", f"ONNX Runtime refused the fused model ({refused})", node_count(model))
    stamp_metadata(model, ctx.model_class)
    with ctx.step("onnxruntime.InferenceSession"):
        return model, open_runner(model, report), report
