"""OpenVINOExporter: the dynamo trace, OpenVINO's decompositions, ``openvino.convert_model``, then OpenVINO IR
(``openvino_model.xml`` + ``openvino_model.bin``) compiled on OpenVINO's CPU plugin.

The file follows the pipeline: the exporter, whose ``prepare`` and ``lower`` run the three stages and, between them,
the toolchain steps; then under each ``# ── Stage N: Title ──`` banner the workarounds of that stage.

1. OpenVINO torch patches — ``@register_patch("openvino", ...)``, active while capturing and converting.
   → capture: the dynamo stages, then ``torch.export.export`` (the kernel's pipeline, ``DYNAMO_TRACER.capture``).
   → ``ExportedProgram.run_decompositions`` with OpenVINO's table (the one ``openvino.convert_model`` applies).
2. Graph preparation — ``@register_fx_node_fix("openvino")`` rewrites of the decomposed graph.
   → ``openvino.convert_model`` on the prepared graph (its FX decoder).
3. Stateful transformation — for a generation program, the KV-cache inputs and outputs become OpenVINO variables
   (``ReadValue``/``Assign``, as ``openvino.passes.MakeStateful`` makes them, with a zeros initializer:
   ``_graph.make_stateful``).
   → ``nncf.compress_weights`` (with ``quantize=``) → ``openvino.save_model`` and ``Core.compile_model`` on the CPU
   plugin, which open the runner the export is verified on.

Every workaround can be left out by name with ``disable=("<function name>",)``; its docstring says **Why**,
**Upstream** and **Remove when**. The runner, I/O names and the reading of untrusted IR are private modules of the
package.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ClassVar

from hfexport import Quantization
from hfexport.plugin import (
    Component,
    ExportConfig,
    ExportContext,
    ExportedModel,
    Exporter,
    RuntimeNeeds,
    Stage,
    Step,
    artifact_file,
    component_manifest,
    register_fx_node_fix,
    register_workaround,
)
from hfexport.quantization import check_quantization_inputs
from hfexport_dynamo import DYNAMO_TRACER, squeeze_only_size_one_dims

from ._config import OpenVINOConfig
from ._graph import call_with_meta, constants_inlined, make_stateful, model_io_names, scan_as_while_loop
from ._naming import io_names, name_model_io
from ._quantize import compress_weights
from ._runner import DATA_FILE, MODEL_FILE, OpenVINORunner
from ._state import OpenVINOState, openvino_state
from ._untrusted import check_ir_file

__all__ = ["MODEL_FILE", "DATA_FILE", "OpenVINOConfig", "OpenVINOExporter", "OpenVINORunner"]


class OpenVINOExporter(Exporter):
    """Export to OpenVINO IR (``openvino_model.xml`` + ``openvino_model.bin``), verified on OpenVINO's CPU plugin."""

    name: ClassVar[str] = "openvino"
    config_class: ClassVar[type[ExportConfig]] = OpenVINOConfig
    tracer = DYNAMO_TRACER
    scopes: ClassVar[tuple[str, ...]] = ("dynamo", "openvino")
    # The CPU plugin keeps OpenVINO variables (ReadValue/Assign) between the calls of one infer request: a program's
    # mutable buffers (a generation task's KV cache) become variables, updated on the runtime (stage 5).
    needs: ClassVar[RuntimeNeeds] = RuntimeNeeds(cache_layout="in_place")
    toolchain: ClassVar[tuple[str, ...]] = (*DYNAMO_TRACER.toolchain, "openvino", "hfexport-openvino")
    tested_versions: ClassVar[dict[str, str]] = {**DYNAMO_TRACER.tested_versions, "openvino": "2026.4.1"}
    stages: ClassVar[tuple[Stage, ...]] = (
        Stage(1, "OpenVINO torch patches", '@register_patch("openvino", ...)'),
        Stage(2, "Graph preparation (OpenVINO decompositions)", '@register_fx_node_fix("openvino")'),
        Stage(3, "Stateful transformation", "internal"),
    )
    steps: ClassVar[tuple[Step, ...]] = (
        Step(1, "capture", "the dynamo stages, torch.export.export"),
        Step(1, "decompose", "ExportedProgram.run_decompositions"),
        Step(2, "convert", "openvino.convert_model"),
        Step(3, "compress", "nncf.compress_weights"),  # quantize= only
        Step(3, "compile", "openvino.save_model, Core.compile_model"),
    )

    @property
    def openvino_config(self) -> OpenVINOConfig:
        """This exporter's config, typed."""
        return self.config_as(OpenVINOConfig)

    def new_state(self, ctx: ExportContext) -> OpenVINOState:
        return OpenVINOState()

    def prepare(self, ctx: ExportContext) -> None:
        """Stage 1: the patches capture and conversion run under."""
        with ctx.stage(1):
            ctx.install_patches(("openvino",))

    def lower(self, ctx: ExportContext) -> None:
        """Stages 2-3 and the steps between them, top to bottom: the captured program to a compiled OpenVINO model."""
        import openvino
        import torch
        from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

        state, config = openvino_state(ctx), self.openvino_config
        with ctx.step("ExportedProgram.run_decompositions"):
            prepared = ctx.program.run_decompositions(_openvino_decompositions())
        with ctx.stage(2):
            ctx.apply_fx_node_fixes(prepared.graph_module, ("openvino",))
        state.io = io_names(ctx.program, ctx.inputs)
        graph, program_states = constants_inlined(prepared)  # mutable buffers stay inputs/outputs
        with ctx.step("openvino.convert_model"), torch.no_grad(), _root_logger_kept():
            # convert_model(ExportedProgram) decodes program.module(), where a mutated buffer is lost (_graph.py)
            model = openvino.convert_model(TorchFXPythonDecoder(graph, dynamic_shapes=True))
        del graph
        inputs, outputs = model_io_names(prepared, program_states, state.io)
        del prepared
        name_model_io(model, inputs, outputs)
        with ctx.stage(3):
            if program_states:
                state.states = make_stateful(model, program_states)
        if isinstance(config.quantize, Quantization):
            with ctx.step("nncf.compress_weights"):
                model, state.quantization = compress_weights(model, config.quantize, config.int4_ratio)

        properties: dict[str, str] = {}
        for registration in ctx.workarounds(_CPU_PROPERTIES, ("openvino",)):
            properties.update(registration.func())
            ctx.record_applied(registration.qualified_name)
        io = {**state.io, "num_threads": config.num_threads, "cpu_properties": properties}
        with ctx.step("openvino.save_model, Core.compile_model"), \
                OpenVINORunner.temporary_directory("openvino") as directory:
            openvino.save_model(model, directory / MODEL_FILE, compress_to_fp16=config.compress_to_fp16)
            state.runner = OpenVINORunner(directory / MODEL_FILE, directory / DATA_FILE, io=io).owning(directory)
        state.manifest = {"model_file": MODEL_FILE, "data_file": DATA_FILE, "device": "CPU",
                          "num_threads": config.num_threads, "cpu_properties": properties,
                          "compress_to_fp16": config.compress_to_fp16,
                          "states": state.states, "node_count": len(model.get_ordered_ops()), **state.io}

    # ── artifact, loading ─────────────────────────────────────────────────────────────────────────────
    def package(self, ctx: ExportContext) -> ExportedModel:
        state = openvino_state(ctx)
        if state.runner is None:
            raise RuntimeError("package() runs after lower(), which compiles the model")
        section = {"program_file": MODEL_FILE, "openvino": state.manifest,
                   **({"quantization": state.quantization} if state.quantization else {})}
        return self.artifact(ctx, [Component("model", state.runner, ctx.program.call_spec.out_spec,
                                             state.runner.write_files, section, ctx.program)])

    def check_inputs(self, inputs: Any, model: Any = None) -> None:
        """The kernel's checks, then ``quantize``'s: a model quantized already is refused before any work."""
        super().check_inputs(inputs, model)
        config = self.openvino_config
        check_quantization_inputs(config.quantize, inputs, model, backend=self.name,
                                  static_shapes=not config.dynamic and not config.dynamic_shapes)

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = "model", *,
                    trust_remote_code: bool = False) -> OpenVINORunner:
        """Compile ``openvino_model.xml`` (weights ``openvino_model.bin``, both hashed in the manifest) on the CPU
        plugin, with the ``INFERENCE_NUM_THREADS`` it was exported with.

        The IR is read as untrusted input whatever ``trust_remote_code`` says: an IR that needs an extension library
        (a layer outside OpenVINO's own operation sets) or declares XML entities is refused
        (``_untrusted.check_ir_file``), and the weights are read only from the ``.bin`` the manifest lists.

        Raises:
            hfexport.UntrustedArtifactError, hfexport.ManifestError: a file the manifest names is missing or outside
                the artifact.
            ValueError: the IR is refused (the message names the layer).
        """
        section = component_manifest(manifest, component).get("openvino", {})
        where = f"components[{component!r}].openvino"
        model_path = artifact_file(path, manifest, section.get("model_file"), f"{where}.model_file")
        data_path = artifact_file(path, manifest, section.get("data_file"), f"{where}.data_file")
        check_ir_file(model_path)
        return OpenVINORunner(model_path, data_path, io=section, untrusted=True)


@contextlib.contextmanager
def _root_logger_kept() -> Any:
    """Restore the root logger's level, filters and handlers after the body, also on error.

    ``openvino.convert_model`` sets the root logger to ERROR (``ovc.logger.init_logger``) and restores it only when
    the conversion succeeds (``openvino/tools/ovc/convert.py``, no ``finally``): after a failed export the caller's
    warnings and hfexport's own stopped printing."""
    import logging

    root = logging.getLogger()
    level, filters, handlers = root.level, list(root.filters), list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.filters, root.handlers = filters, handlers


def _openvino_decompositions() -> Any:
    """The decomposition table ``openvino.convert_model`` runs on an ``ExportedProgram``: torch's default
    (``torch.export.default_decompositions``) less the ops OpenVINO's frontend converts whole
    (``openvino.frontend.pytorch.torchdynamo.export_decompositions.ops_to_not_decompose``)."""
    from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose
    from torch.export import default_decompositions

    table = default_decompositions()
    for op in ops_to_not_decompose():
        table.pop(op, None)
    return table


# ── Stage 1: OpenVINO torch patches ──
# ``@register_patch("openvino", "dotted.path")`` factories, active while capturing and converting (none needed yet).

# ── Stage 2: Graph preparation (OpenVINO decompositions) ──
# ``@register_fx_node_fix("openvino")`` rewrites of the decomposed graph, before the conversion.
@register_fx_node_fix("openvino")
def _fix_cat_legacy_empty(gm: Any, node: Any) -> bool:
    """Drops from ``aten.cat`` the inputs that are 1-D and empty (``torch.tensor([])``) when another input has more
    dims: torch's legacy rule skips them, so the result is the same.

    **Why**: transformers' ``DynamicLayer`` starts a layer's keys and values as ``torch.tensor([])`` and appends with
    ``torch.cat([keys, new], dim=-2)``; a seq2seq decoder step that builds its cache in the program (T5's
    ``text2text-generation`` decode, ``hfexport_dynamo.tasks.seq2seq``) traces that ``cat`` with the empty constant.
    OpenVINO's frontend makes a ``Concat`` of ``f32[0]`` and ``f32[?,?,?,8]`` and fails: ``Axis -2 out of the tensor
    rank range [-1, 0]`` (``Conversion is failed for: SequenceMark, aten.cat.default``).
    **Upstream**: none found for the legacy empty-tensor rule in OpenVINO's ``aten.cat`` translation
    (``src/frontends/pytorch/src/op/cat.cpp``); model-side, transformers' ``DynamicLayer.lazy_initialization``.
    **Remove when**: a tiny T5 ``task="text2text-generation"`` export on openvino converts with
    ``disable=("_fix_cat_legacy_empty",)``.
    """
    import torch

    if node.op != "call_function" or node.target is not torch.ops.aten.cat.default or not node.args:
        return False
    tensors = list(node.args[0])
    vals = [t.meta.get("val") if isinstance(t, torch.fx.Node) else None for t in tensors]
    if any(v is None for v in vals) or max(v.dim() for v in vals) < 2:
        return False
    kept = [t for t, v in zip(tensors, vals, strict=True)
            if not (v.dim() == 1 and isinstance(v.shape[0], int) and v.shape[0] == 0)]
    if len(kept) == len(tensors) or not kept:
        return False
    node.args = (kept, *node.args[1:])
    return True


@register_fx_node_fix("openvino")
def _fix_sdpa_fully_masked_rows(gm: Any, node: Any) -> bool:
    """Replaces ``sdpa(q, k, v, mask)`` by ``where(any(visible(mask), -1, keepdim), sdpa(q, k, v, mask), 0)``:
    a query row whose mask hides every key gets zeros, as in eager; ``visible`` is the boolean mask itself, or
    ``mask != -inf`` for an additive float mask. Rows that see a key are unchanged.

    **Why**: eager's SDPA (``_safe_softmax``) returns 0 for a query row that sees no key; OpenVINO's
    ``ScaledDotProductAttention`` on the CPU plugin returns NaN there. A left-padded row of a decoder (its padding
    positions see no key under the causal mask) then has NaN hidden states: a tiny Llama's logits at the padding
    positions were NaN where eager's are finite.
    **Upstream**: none found for OpenVINO (the same difference as torchlib's, microsoft/onnxscript#2479, and
    pytorch/pytorch#103749 for eager's semantics).
    **Remove when**: OpenVINO's SDPA zeroes fully masked rows (a tiny Llama, no task, left-padded batch matches
    eager at every position with ``disable=("_fix_sdpa_fully_masked_rows",)``).
    """
    import torch

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
        return False
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if not isinstance(mask, torch.fx.Node) or "val" not in mask.meta or "val" not in node.meta:
        return False
    if any(user.op == "call_function" and user.target is aten.where.self and user.args[1] is node
           for user in node.users):
        return False  # fixed already (the fix runs once per graph, this keeps it idempotent)
    graph = gm.graph
    with graph.inserting_before(node.next):  # in order, after the attention
        if mask.meta["val"].dtype == torch.bool:
            visible = mask
        else:
            visible = _call(graph, aten.ne.Scalar, (mask, float("-inf")), {}, node)
        sees = _call(graph, aten.any.dim, (visible, -1, True), {}, node)
        zero = _call(graph, aten.scalar_tensor.default, (0.0,), {"dtype": node.meta["val"].dtype}, node)
        result = _call(graph, aten.where.self, (sees, node, zero), {}, node)
    for user in list(node.users):
        if user is not result and user not in (sees, visible, zero):
            user.replace_input_with(node, result)
    return True


@register_fx_node_fix("openvino")
def _fix_index_put_leading_slices(gm: Any, node: Any) -> bool:
    """Replaces the leading ``None`` (whole-dim) indices of ``aten.index_put`` by explicit ``arange`` indices,
    broadcast against the others: ``index_put(x, [None, p], v)`` becomes ``index_put(x, [arange(n)[:, None],
    p[None, :]], v)``, which indexes the same elements. Only for leading dims of static size followed by tensor
    indices only.

    **Why**: OpenVINO's frontend lowers an ``index_put`` with a leading ``None`` as a ``Transpose`` of the whole
    tensor (indexed dims first), a ``ScatterNDUpdate`` and a ``Transpose`` back. The KV-cache write of a stateful
    generation program (``cache[:, positions] = new``, ``hfexport_dynamo.tasks.kv_cache``: the form ExecuTorch's
    in-place kernel needs) then copies the whole cache twice per layer and per decode step: 15.0 of 44.0 ms of a toy
    Llama's step (512 hidden, 8 layers, cache of 1,024 positions, one thread) went to those transposes.
    **Upstream**: none found (OpenVINO's ``aten.index_put`` translation,
    ``src/frontends/pytorch/src/op/index_put_.cpp``); model-side, the cache write of
    ``hfexport_dynamo.tasks.kv_cache.capacity_layer``.
    **Remove when**: a toy ``task="text-generation"`` export's decode step has no ``Transpose`` from ``index_put``
    in the CPU plugin's performance counters with ``disable=("_fix_index_put_leading_slices",)``.
    """
    import torch

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.index_put.default:
        return False
    data, indices = node.args[0], list(node.args[1])
    leading = next((i for i, index in enumerate(indices) if index is not None), len(indices))
    rest = indices[leading:]
    if leading == 0 or not rest or any(not isinstance(index, torch.fx.Node) or "val" not in index.meta
                                       for index in rest) or "val" not in data.meta:
        return False
    sizes = data.meta["val"].shape[:leading]
    if not all(isinstance(size, int) for size in sizes):
        return False
    rank = max(index.meta["val"].dim() for index in rest)  # the tensor indices' broadcast rank
    graph, explicit = gm.graph, []
    with graph.inserting_before(node):
        for dim, size in enumerate(sizes):
            arange = _call(graph, aten.arange.start_step, (0, size, 1),
                           {"dtype": rest[0].meta["val"].dtype}, node)
            shape = [1] * dim + [size] + [1] * (leading - 1 - dim + rank)
            explicit.append(_call(graph, aten.view.default, (arange, shape), {}, node))
    node.args = (data, [*explicit, *rest], *node.args[2:])
    return True


@register_fx_node_fix("openvino")
def _fix_squeeze_dims_torch_keeps(gm: Any, node: Any) -> bool:
    """Drops from ``aten.squeeze.dims`` the dims that torch leaves in place: those whose traced size is not the
    integer 1 (a dynamic dim, or a static one above 1); a squeeze left with no dim becomes ``aten.alias``.

    **Why**: torch's ``squeeze(dims)`` leaves a dim whose size is not 1 unchanged, and the traced program's output
    shape says which dims it removed. OpenVINO's ``Squeeze`` (opset 1) removes the listed axes of a dynamic dim and
    fails at inference when one is not 1: MBart's ``shift_tokens_right`` (``gather(...).squeeze()`` of a
    ``[batch, 1]`` tensor, traced as ``squeeze.dims(x, [0, 1])``) made MBartForSequenceClassification fail with
    ``[CPU] Squeeze node ... Can not clone with new dims. Descriptor's shape: {1} is incompatible with provided
    dimensions: {10}`` at batch 10.
    **Upstream**: openvinotoolkit/openvino#24715 (static non-squeezable axes allowed, dynamic ones not) and #26989
    (Squeeze-15's ``allow_axis_skip``, which the PyTorch frontend does not emit for ``squeeze.dims``).
    **Remove when**: a tiny MBartForSequenceClassification exported with ``dynamic=True`` runs at another batch with
    ``disable=("_fix_squeeze_dims_torch_keeps",)``.
    """
    return squeeze_only_size_one_dims(node)


@register_fx_node_fix("openvino")
def _fix_symint_min_max_mod_as_tensors(gm: Any, node: Any) -> bool:
    """Computes ``torch.sym_min``, ``torch.sym_max`` and ``%`` of SymInts (a dynamic dim's arithmetic) on 0-d int64
    tensors: ``_local_scalar_dense(minimum(scalar_tensor(a), scalar_tensor(b)))`` (``maximum``, ``remainder``), the
    same integer with ``meta["val"]`` kept.

    **Why**: OpenVINO's FX decoder converts only ``+``, ``-``, ``*`` and ``//`` of SymInts; a program with another
    fails in ``openvino.convert_model`` with ``No conversion rule found for operations: <built-in function mod>``
    (Bamba, Falcon-H1, Bailing-hybrid, CANINE in the sample sweep) or ``<function sym_min>`` (DeepSeek-V3.2,
    dots3-note, AXK2). The tensor ops convert (Minimum, Maximum, FloorMod).
    **Upstream**: none found (OpenVINO's PyTorch frontend op table, ``src/frontends/pytorch/src/op_table.cpp``,
    has ``_operator.add``/``sub``/``mul``/``floordiv`` only).
    **Remove when**: a module computing ``torch.sym_min(n, 5)``, ``torch.sym_max(n, 7)`` and ``n % 3`` of a
    dynamic dim converts with ``disable=("_fix_symint_min_max_mod_as_tensors",)``.
    """
    import operator

    import torch

    aten = torch.ops.aten
    tensor_op = {torch.sym_min: aten.minimum.default, torch.sym_max: aten.maximum.default,
                 operator.mod: aten.remainder.Tensor}.get(node.target) if node.op == "call_function" else None
    value = node.meta.get("val")
    if tensor_op is None or not isinstance(value, torch.SymInt) or len(node.args) != 2:
        return False
    graph = gm.graph
    with graph.inserting_before(node):
        operands = [_call(graph, aten.scalar_tensor.default, (arg,), {"dtype": torch.int64}, node)
                    for arg in node.args]
        result = _call(graph, tensor_op, tuple(operands), {}, node)
        scalar = graph.call_function(aten._local_scalar_dense.default, (result,))
    scalar.meta.update(node.meta)  # the same SymInt for the nodes that use it
    node.replace_all_uses_with(scalar)
    graph.erase_node(node)
    return True


@register_fx_node_fix("openvino")
def _fix_index_add_explicit_alpha(gm: Any, node: Any) -> bool:
    """Passes ``aten.index_add``'s ``alpha`` (default 1) as its fifth argument.

    **Why**: OpenVINO's translation of ``aten.index_add`` reads five inputs and failed on the traced four
    (``Got less inputs 4 than expected 5 ... Conversion is failed for: aten.index_add.default``: JetMoE's expert
    combination in the sample sweep).
    **Upstream**: none found (OpenVINO's ``src/frontends/pytorch/src/op/index_add.cpp``).
    **Remove when**: ``x.index_add(0, index, source)`` converts with ``disable=("_fix_index_add_explicit_alpha",)``.
    """
    import torch

    if node.op != "call_function" or node.target is not torch.ops.aten.index_add.default or len(node.args) != 4:
        return False
    node.args = (*node.args, node.kwargs.get("alpha", 1))
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}
    return True


@register_fx_node_fix("openvino")
def _fix_scan_as_while_loop(gm: Any, node: Any) -> bool:
    """Rewrites a ``torch.ops.higher_order.scan`` as a ``torch.ops.higher_order.while_loop`` over the scanned dim,
    every operand carried (``_graph.scan_as_while_loop``): the same ops in the same order.

    **Why**: OpenVINO's FX frontend converts ``while_loop`` (to a ``Loop``) but has no translation of ``scan``; the
    recurrences that ``hfexport_dynamo`` runs as a scan op (Mamba's selective scan, RWKV's WKV, RecurrentGemma's
    RG-LRU) failed with ``No conversion rule found for operations: scan`` (Mamba, FalconMamba, Jamba, Zamba,
    RecurrentGemma, RWKV in the sample sweep). Its ``while_loop`` translation also counts ``additional_inputs`` as
    carried values and failed on them (``body_fn must return same number of outputs as carried inputs``,
    ``loop.cpp``), so none is left additional.
    **Upstream**: openvinotoolkit/openvino#33173 (``while_loop`` for the FX frontend; ``scan`` not covered);
    model-side, ``hfexport_dynamo``'s recurrence patches.
    **Remove when**: ``tests/openvino``'s scan module converts with ``disable=("_fix_scan_as_while_loop",)``.
    """
    import torch

    if node.op != "call_function" or node.target is not torch.ops.higher_order.scan:
        return False
    return scan_as_while_loop(gm, node)


@register_fx_node_fix("openvino")
def _fix_unique_consecutive_as_mask(gm: Any, node: Any) -> bool:
    """Replaces ``torch.unique_consecutive(x)`` of a 1-D ``x`` (no inverse, no counts) by the elements that differ
    from their predecessor: ``x[nonzero(cat([True], x[1:] != x[:-1])[:len(x)])]``, the same values in the same
    order.

    **Why**: OpenVINO's FX decoder has no rule for ``aten.unique_consecutive`` (``No conversion rule found for
    operations: aten.unique_consecutive.default``): Qwen2.5-VL's vision windows (``transformers.vision_utils``
    drops repeated window boundaries with it) failed with an image on Qwen2.5-VL and HyperCLOVAX-Vision-V2 in the
    sample sweep. ``NotEqual``, ``Concat``, ``NonZero`` and ``Gather`` convert.
    **Upstream**: none found (the FX part of OpenVINO's PyTorch frontend op table,
    ``src/frontends/pytorch/src/op_table.cpp``); model-side, ``transformers/vision_utils.py``.
    **Remove when**: ``torch.unique_consecutive`` of a dynamic 1-D tensor converts with
    ``disable=("_fix_unique_consecutive_as_mask",)``.
    """
    import operator

    import torch

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.unique_consecutive.default:
        return False
    x = node.args[0]
    options = dict(zip(("return_inverse", "return_counts", "dim"), node.args[1:], strict=False), **node.kwargs)
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if value is None or value.dim() != 1 or any(options.get(k) for k in ("return_inverse", "return_counts")) \
            or options.get("dim") is not None:
        return False
    firsts = [user for user in node.users if user.target is operator.getitem and user.args[1] == 0]
    if len(firsts) != len(node.users):
        return False  # the inverse or the counts are used
    graph = gm.graph
    with graph.inserting_before(node):
        rest = _call(graph, aten.slice.Tensor, (x, 0, 1), {}, x)
        before = _call(graph, aten.slice.Tensor, (x, 0, 0, -1), {}, x)
        changed = _call(graph, aten.ne.Tensor, (rest, before), {}, x)
        head = _call(graph, aten.ones.default, ([1],), {"dtype": torch.bool}, x)
        keep = _call(graph, aten.slice.Tensor, (_call(graph, aten.cat.default, ([head, changed],), {}, x), 0, 0,
                                                 _call(graph, aten.sym_size.int, (x, 0), {}, x)), {}, x)
        where = _call(graph, aten.nonzero.default, (keep,), {}, x)
        kept = _call(graph, aten.index_select.default, (x, 0, _call(graph, aten.squeeze.dim, (where, 1), {}, x)), {}, x)
    for user in firsts:
        kept.meta["val"] = user.meta.get("val", kept.meta.get("val"))  # the unbacked size its users were traced with
        user.replace_all_uses_with(kept)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


def _call(graph: Any, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], like: Any) -> Any:
    """A new ``call_function`` node of ``op``, its ``meta["val"]`` computed on the fake tensors of its inputs (in
    ``like``'s fake mode, else the graph's: ``like`` may be a SymInt node)."""
    return call_with_meta(graph, op, args, kwargs, getattr(like.meta.get("val"), "fake_mode", None))


# ── Stage 3: Stateful transformation ──
# ``_graph.make_stateful`` (internal). Then, in the step ``Core.compile_model``, the CPU plugin's properties that work
# around its bugs,
# registered as the "openvino_cpu_property" kind: each returns properties for ``Core.compile_model``, recorded in
# the manifest (``openvino.cpu_properties``) so that a loaded artifact compiles as its verified export did.
_CPU_PROPERTIES = "openvino_cpu_property"  # the registry kind (its extension point)


@register_workaround("openvino_cpu_property", "openvino")
def _fix_cpu_snippets_disabled() -> dict[str, str]:
    """Compiles with ``SNIPPETS_MODE=DISABLE``: the CPU plugin runs element-wise chains op by op instead of as its
    JIT-fused snippet subgraphs.

    **Why**: with snippets the CPU plugin computed wrong values for Inkling's text decoder (the sample sweep's
    InklingTextModel and InklingModel: max abs diff 3.2 to 5.7 against eager at the traced shape, NaN at the second,
    varying from one compilation to the next) and JetMoE (0.70); every intermediate added as an output (which keeps
    them from being fused) or snippets disabled gives 7.7e-7 (JetMoE 1.8e-7). Cost measured on MiniLM (batch 8 x 128, one thread): 385 against
    372 ms (+3.6%).
    **Upstream**: openvinotoolkit/openvino#37989 (CPU snippets transformations produce a value mismatch, open, seen
    on 2026.3); #25744 (results right once outputs are added).
    **Remove when**: ``test_inkling_matches_eager_without_snippets`` sees the model match eager with
    ``disable=("_fix_cpu_snippets_disabled",)``.
    """
    return {"SNIPPETS_MODE": "DISABLE"}
