"""ExecuTorch's stage 3 for XNNPACK: ``@register_patch("executorch.xnnpack.internals", ...)`` for XNNPACK's
partitioner configs, passes and ``preprocess`` where they take what the serializer refuses, compute something else
than the graph, or copy what they need not; and ``@register_patch("executorch.quantization", ...)`` for its
quantizer, installed by ``quantize="int8"`` only (in the step ``prepare_pt2e, calibration, convert_pt2e``).

A partitioner check here narrows what XNNPACK takes (:func:`_narrowed`): a node it refuses runs on a portable kernel
and the rest of the graph is delegated as before. Each is an upstream bug or gap worked around until the fix named
in its **Remove when**; ``disable=("<name>",)`` leaves one out. The tests: ``tests/executorch/
test_executorch_workarounds.py``, ``test_xnnpack_linear.py`` and ``test_executorch_export_cost.py``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hfexport.plugin import register_patch

__all__ = ["LinearOfPartition", "linear_of_partition"]

aten = torch.ops.aten


def _narrowed(original: Any, accepts: Callable[[torch.fx.Node], bool]) -> Any:
    """An XNNPACK partitioner config's ``check_constraints`` that also requires ``accepts(node)``: a node it
    refuses stays on the portable kernel, and the rest of the graph is delegated as before."""

    @functools.wraps(original)
    def check_constraints(self: Any, node: torch.fx.Node, ep: Any) -> bool:
        return original(self, node, ep) and accepts(node)

    return check_constraints


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack.partition.config.xnnpack_config.XNNPartitionerConfig."
                "check_common_constraints")
def _patch_rank_above_xnnpack_limit_not_delegated(original: Any) -> Any:
    """Leaves to portable kernels a node with a tensor of more than ``XNN_MAX_TENSOR_DIMS`` (6) dims.

    **Why**: no partitioner config checks the rank, so a rank-8 ``view_copy`` was delegated and the program failed at
    load (``xnn_status_unsupported_parameter``): Inkling's temporal patches.
    **Upstream**: none found (the partitioner's common constraints).
    **Remove when**: the partitioner checks ``XNN_MAX_TENSOR_DIMS`` (the test's module loads with it disabled).
    """
    from executorch.backends.xnnpack.utils.xnnpack_constants import XNN_MAX_TENSOR_DIMS

    def within_rank(node: torch.fx.Node) -> bool:
        values = [node.meta.get("val")] + [arg.meta.get("val") for arg in node.all_input_nodes]
        return all(not isinstance(v, torch.Tensor) or v.dim() <= XNN_MAX_TENSOR_DIMS
                   for value in values for v in (value if isinstance(value, list | tuple) else [value]))

    return _narrowed(original, within_rank)


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints")
def _patch_unsqueeze_one_dynamic_dim(original: Any) -> Any:
    """Leaves to portable kernels an ``unsqueeze_copy`` whose output has more than one dynamic dim.

    **Why**: XNNPACK serializes it as a static reshape, which takes one dynamic dim ("XNNPACK reshape only supports 1
    dynamic dimension"), but ``UnsqueezeCopyConfig`` takes it: the whole export failed (Aya Vision).
    **Upstream**: none found (the partitioner config and the serializer disagree; unchanged on main).
    **Remove when**: ``UnsqueezeCopyConfig`` checks its output's dynamic dims (the test's module exports with it
    disabled).
    """
    from torch.fx.experimental.symbolic_shapes import free_symbols

    def at_most_one_dynamic_dim(node: torch.fx.Node) -> bool:
        value = node.meta.get("val")
        return value is None or sum(1 for size in value.shape if free_symbols(size)) <= 1

    return _narrowed(original, at_most_one_dynamic_dim)


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints")
def _patch_conv1d_one_dynamic_dim(original: Any) -> Any:
    """Leaves to portable kernels a 1-d convolution whose input or output has more than one dynamic dim.

    **Why**: XNNPACK runs it as a 2-d one between static reshapes, which take one dynamic dim, but
    ``ConvolutionConfig`` takes it: with ``dynamic=True`` every audio encoder with a convolutional front end failed
    (Wav2Vec2, HuBERT, Whisper).
    **Upstream**: none found (the partitioner config and the serializer disagree; unchanged on main).
    **Remove when**: ``ConvolutionConfig`` checks a 1-d convolution's dynamic dims (the tiny Wav2Vec2 exports with it
    disabled).
    """
    from torch.fx.experimental.symbolic_shapes import free_symbols

    def dynamic_dims(value: Any) -> int:
        return sum(1 for size in getattr(value, "shape", ()) if free_symbols(size))

    def not_1d_with_dynamic_dims(node: torch.fx.Node) -> bool:
        weight = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
        if weight is None or weight.dim() != 3:
            return True  # not a 1-d convolution
        source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        return dynamic_dims(node.meta.get("val")) <= 1 and dynamic_dims(source) <= 1

    return _narrowed(original, not_1d_with_dynamic_dims)


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack.partition.config.generic_node_configs.GeluConfig.check_constraints")
def _patch_gelu_tanh_not_delegated(original: Any) -> Any:
    """Leaves to the portable kernel a ``gelu`` with ``approximate="tanh"``.

    **Why**: XNNPACK serializes every ``gelu`` as exact GELU: the tanh form (SigLIP, Gemma) was off by up to 4.7e-4
    per element, with no error.
    **Upstream**: pytorch/executorch#22851 (tanh GELU as ``XNNApproxGelu``; after executorch 1.5.1).
    **Remove when**: the pinned executorch includes pytorch/executorch#22851 (the test's module matches with it
    disabled).
    """

    def exact(node: torch.fx.Node) -> bool:
        return node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") == "none"

    return _narrowed(original, exact)


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack.partition.config.node_configs.MaxDimConfig.check_constraints")
def _patch_max_dim_serializable(original: Any) -> Any:
    """Leaves to portable kernels a ``max.dim`` that XNNPACK's serializer refuses (dim not 2 or 3, no keepdim).

    **Why**: ``MaxDimConfig`` checks only the rank and dtypes, and the serializer then failed the whole export
    ("amax.default only supports dim == 2 or dim == 3"): GPT-OSS and MiMo-V2-Flash (attention sinks), Hiera.
    **Upstream**: none found (pytorch/executorch#11988 tracks the same kind of gap for other ops).
    **Remove when**: ``MaxDimConfig`` checks the dim and keepdim (the test's module exports with it disabled).
    """

    def serializable(node: torch.fx.Node) -> bool:  # the serializer reads the positional args, unnormalized
        return len(node.args) == 3 and node.args[2] is True and node.args[1] in (2, 3)

    return _narrowed(original, serializable)


def _shape(node: Any) -> list[str] | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return [str(s) for s in value.shape] if isinstance(value, torch.Tensor) else None


@dataclass
class LinearOfPartition:
    """What a ``torch.nn.Linear`` source partition computes: ``output = linear(input, weight, bias)``."""

    input: torch.fx.Node
    bias: torch.fx.Node | None
    output: torch.fx.Node


def linear_of_partition(mm: torch.fx.Node, src_partition: Any) -> LinearOfPartition | None:
    """The Linear that the source partition of ``mm`` (an edge ``mm``/``addmm``) computes, when only
    order-preserving reshapes (``view_copy``, ``unsqueeze_copy``, ``squeeze_copy``) stand between the partition's
    input and the ``mm`` and between the ``mm`` and the partition's output, with at most one bias add (of a
    partition input or parameter of shape ``[out_features]``) after the ``mm``, and the output has the input's
    leading dims; else None (a ``permute`` of the input, a second add or matmul, another output shape)."""
    from executorch.exir.dialects._ops import ops as exir_ops

    edge = exir_ops.edge.aten
    reshapes = (edge.view_copy.default, edge.unsqueeze_copy.default, edge.squeeze_copy.dims,
                edge.squeeze_copy.dim, edge.squeeze_copy.default)
    addmm = mm.target == edge.addmm.default
    inputs, params = list(src_partition.input_nodes), list(getattr(src_partition, "params", []))
    start = mm.args[1] if addmm else mm.args[0]
    linear_input = start
    while linear_input not in inputs:  # back from the mm's input to the partition's input, through reshapes
        if not isinstance(linear_input, torch.fx.Node) or linear_input.target not in reshapes:
            return None
        linear_input = linear_input.args[0]
    outputs = [n for n in src_partition.output_nodes
               if n.target != torch.ops.aten.sym_size.int and n.op != "placeholder"]
    shape_in, shape_mm_in, shape_mm = _shape(linear_input), _shape(start), _shape(mm)
    if len(outputs) != 1 or not (shape_in and shape_mm_in and shape_mm) or shape_in[-1] != shape_mm_in[-1]:
        return None
    bias, output, current = (mm.args[0] if addmm else None), outputs[0], mm
    while current is not output:  # forward from the mm along single users to the partition's output
        users = list(current.users)
        if len(users) != 1:
            return None
        user = users[0]
        if user.target in reshapes and user.args[0] is current:
            current = user
            continue
        if (bias is not None or user.target != edge.add.Tensor or len(user.args) != 2
                or user.kwargs.get("alpha", 1) != 1):
            return None
        other = user.args[1] if user.args[0] is current else user.args[0]
        if other not in inputs + params or _shape(other) != [shape_mm[-1]]:
            return None
        bias, current = other, user
    computed = [n for n in src_partition.nodes if n.op == "call_function" and n.target in (
        edge.add.Tensor, edge.mm.default, edge.addmm.default, edge.bmm.default)]
    if len(computed) != 1 + (bias is not None and not addmm):
        return None  # another add or matmul in the partition: not one Linear
    shape_out = _shape(output)
    if shape_out is None or shape_out[:-1] != shape_in[:-1] or shape_out[-1] != shape_mm[-1]:
        return None
    return LinearOfPartition(linear_input, bias, output)


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack._passes.convert_to_linear.ConvertToLinearPass.create_linear")
def _patch_linear_conversion_through_reshapes(original: Any) -> Any:
    """Rebuilds a Linear's source partition as ``linear(input, weight, bias)`` with the bias found past reshapes.

    **Why**: ``ConvertToLinearPass.create_linear`` looks for the bias only right after the ``mm``; ``torch.vmap`` over
    a Linear adds it after reshapes, and the delegated program dropped it with no error (e02: max abs diff 0.66).
    **Upstream**: none found (``backends/xnnpack/_passes/convert_to_linear.py``); pytorch/executorch#10499 (open) is
    the same pass's missing transpose.
    **Remove when**: ``create_linear`` finds the bias past reshapes (the test's ``vmap`` module matches with it
    disabled).
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    edge = exir_ops.edge.aten

    @functools.wraps(original)
    def create_linear(self: Any, graph_module: torch.fx.GraphModule, node: torch.fx.Node, src_partition: Any) -> Any:
        found = linear_of_partition(node, src_partition)
        if node.target not in (edge.mm.default, edge.addmm.default) or found is None:
            return original(self, graph_module, node, src_partition)
        from executorch.backends.transforms import get_shape

        weight = self.find(self.get_arg(node, "weight"), src_partition.input_nodes + src_partition.params)
        addmm_bias = node.target == edge.addmm.default and found.bias is not None
        args = (found.input, weight) + ((found.bias,) if addmm_bias else ())
        with graph_module.graph.inserting_before(found.output):
            result = graph_module.graph.create_node("call_function", edge.linear.default, args)
            result.meta["val"] = torch.zeros(get_shape(found.output))  # as upstream; the pass retraces the metadata
            if found.bias is not None and not addmm_bias:  # a bias the delegate takes as an input: added apart
                result = graph_module.graph.create_node("call_function", edge.add.Tensor, (result, found.bias))
                result.meta["val"] = torch.zeros(get_shape(found.output))
        found.output.replace_all_uses_with(result)
        graph_module.graph.eliminate_dead_code()
        return None

    return create_linear


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack.partition.config.gemm_configs.AddmmConfig.get_deps")
def _patch_linear_partition_exact(original: Any) -> Any:
    """Leaves to portable kernels an ``mm``/``addmm`` whose Linear source partition is not exactly one Linear.

    **Why**: ``AddmmConfig.get_deps`` delegates the whole partition and ``ConvertToLinearPass`` rebuilds it from its
    input, whatever lies between: ``vmap(linear, in_dims=1)`` puts a ``permute`` there, and the export failed ("a and
    b must have same reduction dim").
    **Upstream**: none found (``partition/config/gemm_configs.py``); pytorch/executorch#10499 is the pass's side.
    **Remove when**: the partitioner or the pass checks the ops inside the partition (the test exports with it
    disabled).
    """

    @functools.wraps(original)
    def get_deps(self: Any, node: torch.fx.Node, ep: Any) -> Any:
        from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

        partitions = get_source_partitions(ep.graph, self.linear_modules)
        src = next((p for ps in partitions.values() for p in ps if node in p.nodes), None)
        if src is not None and linear_of_partition(node, src) is None:
            return False, []
        return original(self, node, ep)

    return get_deps


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass._is_nhwc")
def _patch_is_nhwc_without_size_guards(original: Any) -> Any:
    """Asks XNNPACK's layout pass whether a value is channels-last with the ShapeEnv's guards suppressed.

    **Why**: its ``is_contiguous(channels_last)`` on a traced 1x1 spatial size guards the image to ``[0, 32]`` after
    the bounds were set (64): RegNet and ConvNext failed on a 33x33 image (``resize a bounded tensor``, 0x10). The
    answer does not depend on the guard.
    **Upstream**: none found (the XNNPACK layout pass guards on symbolic sizes).
    **Remove when**: the pass asks for the layout without guarding (``guard_or_false``, or the value's ``dim_order``).
    """
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    @functools.wraps(original)
    def _is_nhwc(self: Any, tensor: Any) -> Any:
        env = next((s.node.shape_env for s in getattr(tensor, "shape", ())
                    if isinstance(s, torch.SymInt)), None)
        if not isinstance(env, ShapeEnv):
            return original(self, tensor)
        with env.suppress_guards():
            return original(self, tensor)

    return _is_nhwc


@register_patch(
    "executorch.xnnpack.internals",
    "executorch.backends.xnnpack.xnnpack_preprocess.XnnpackBackend.copy_exported_program_for_preprocess",
)
def _patch_preprocess_copy_shares_weights(original: Any) -> Any:
    """Copies each partition's program for XNNPACK's ``preprocess`` with its weights shared, not copied.

    **Why**: ``lower_all_submodules_to_backend`` deep-copies the program for every partition before the first
    ``preprocess``: +2.5 GB of peak and 7 s for the Qwen2-0.5B-shaped decoder; XNNPACK's passes never write a weight.
    **Upstream**: none found (``exir/backend/backend_details.py``); ``CudaBackend`` already copies with weights
    shared.
    **Remove when**: ``XnnpackBackend`` copies with the weights shared (the test sees copies with it disabled).
    """

    def copy_exported_program_for_preprocess(cls: Any, edge_program: Any, compile_specs: Any) -> Any:
        shared = {
            id(tensor): tensor
            for table in (edge_program.state_dict, edge_program.constants)
            for tensor in table.values()
            if isinstance(tensor, torch.Tensor)
        }
        return copy.deepcopy(edge_program, shared)

    return classmethod(functools.wraps(original)(copy_exported_program_for_preprocess))


@register_patch("executorch.xnnpack.internals",
                "executorch.backends.xnnpack.xnnpack_preprocess.generate_node_to_external_map")
def _patch_pass_through_outputs_copied(original: Any) -> Any:
    """Gives each output of an XNNPACK partition that is one of its inputs, or an output twice, its own copy
    (``aten.clone``, XNNPACK's ``XNNCopy``) before the partition's inputs and outputs are numbered.

    **Why**: a partition returned one ``slice_copy`` twice (read again by the next in-place row update of a Python
    loop, ``a[..., i, :i] = row + ...``: Qwen3-Next's chunked gated delta rule, f12), and ``preprocess`` refused it:
    ``Output node 'aten_slice_copy_tensor' is already in the inputs ... not supported in XNNPACK Delegate``.
    **Upstream**: pytorch/executorch#14937 (the assert, "temporary until we allow passthrough args in the delegate"),
    pytorch/executorch#19152 (a permute with two consumers).
    **Remove when**: the delegate takes pass-through outputs (``test_patch_pass_through_outputs_copied`` lowers with it
    disabled).
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    @functools.wraps(original)
    def generate_node_to_external_map(exported_program: Any, edge_graph_module: torch.fx.GraphModule) -> Any:
        graph = edge_graph_module.graph
        output = graph.output_node()
        inputs = {n for n in graph.nodes if n.op == "placeholder"}
        seen: set[torch.fx.Node] = set()
        changed = False
        flat = list(output.args[0]) if isinstance(output.args[0], list | tuple) else [output.args[0]]
        for i, value in enumerate(flat):
            if isinstance(value, torch.fx.Node) and (value in inputs or value in seen):
                with graph.inserting_before(output):
                    copy_node = graph.call_function(exir_ops.edge.aten.clone.default, (value,))
                copy_node.meta = {k: v for k, v in value.meta.items() if k in ("val", "tensor_meta")}
                flat[i] = copy_node
                changed = True
            elif isinstance(value, torch.fx.Node):
                seen.add(value)
        if changed:
            output.args = (type(output.args[0])(flat) if isinstance(output.args[0], list | tuple) else flat[0],
                           *output.args[1:])
            edge_graph_module.recompile()
        return original(exported_program, edge_graph_module)

    return generate_node_to_external_map


@register_patch("executorch.quantization",
                "executorch.backends.xnnpack.quantizer.xnnpack_quantizer._convert_scalars_to_attrs")
def _patch_xnnpack_quantizer_integer_scalars(original: Any) -> Any:
    """Keeps the integer dtype of the scalars the XNNPACK quantizer turns into constants (``quantize="int8"``).

    **Why**: ``_convert_scalars_to_attrs`` makes each add/mul scalar ``torch.tensor(float(s))``: transformers'
    ``arange(n) + 0`` turns float and calibration fails, ``tensors used as indices must be long`` (every BERT-style
    encoder).
    **Upstream**: none found (``backends/xnnpack/quantizer/xnnpack_quantizer_utils.py``).
    **Remove when**: the conversion skips integer operands or keeps the scalar's dtype.
    """

    @functools.wraps(original)
    def convert_scalars_to_attrs(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = original(model)
        for node in model.graph.nodes:
            value = node.meta.get("val")
            if node.op != "call_function" or node.target not in (aten.add.Tensor, aten.mul.Tensor) \
                    or not isinstance(value, torch.Tensor) or value.is_floating_point():
                continue
            for arg in node.args:
                if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" and arg.target in model._buffers:
                    model._buffers[arg.target] = model._buffers[arg.target].to(value.dtype)
        return model

    return convert_scalars_to_attrs
