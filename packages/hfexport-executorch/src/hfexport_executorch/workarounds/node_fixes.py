"""ExecuTorch's stage 5, FX node fixes: ``@register_fx_node_fix("executorch")`` (and ``"executorch.xnnpack"``) rewrites
of the captured program's nodes before ``to_edge_transform_and_lower``: Python sym ops ExecuTorch cannot emit, ops
its portable kernels or its edge verifier refuse, and ops in the form XNNPACK's partitioner takes.

Each is an upstream bug or gap worked around until the fix named in its **Remove when**; ``disable=("<name>",)``
leaves one out. The tests: ``tests/executorch/test_executorch_workarounds.py``, ``test_executorch_bounds.py`` and
``test_xnnpack_partitions.py``.
"""

from __future__ import annotations

import operator

import torch

from hfexport.plugin import ExportContext, register_fx_node_fix

from .._graph import GRAPH_ASSERTS, emit, is_symint_arg, replace_with_chain, value
from .._state import executorch_state

__all__: list[str] = []

aten = torch.ops.aten


def _last_dim_mean(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input of ``aten.mean.dim(x, [-1], keepdim=True)`` over a rank-3 float ``x`` with at most one symbolic
    size, else None."""
    if node.op != "call_function" or node.target is not torch.ops.aten.mean.dim or node.kwargs.get("dtype"):
        return None
    source = node.args[0]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not keepdim or not isinstance(value, torch.Tensor) or value.dim() != 3 or not value.dtype.is_floating_point:
        return None
    dims = node.args[1]
    if not isinstance(dims, list | tuple) or len(dims) != 1 or dims[0] not in (-1, 2):
        return None
    if sum(not isinstance(size, int) for size in value.shape) > 1 or not isinstance(value.shape[2], int):
        return None
    return source


@register_fx_node_fix("executorch.xnnpack")
def _fix_last_dim_mean_as_average_pooling(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Rewrites ``x.mean(-1, keepdim=True)`` of a rank-3 ``x`` (RMSNorm's) as XNNPACK's global average pooling.

    **Why**: XNNPACK takes ``mean.dim`` only over the two innermost dims of a 4-D tensor, so each RMSNorm cut its
    layer's partition: the Qwen2-0.5B-shaped decoder had 123 partitions. Only where the input has at most one symbolic
    size.
    **Upstream**: pytorch/executorch#19206 (``MeanDimConfig``'s constraints).
    **Remove when**: XNNPACK's partitioner takes ``mean.dim`` over the last dim of a 3-D tensor.
    """
    source = _last_dim_mean(node)
    if source is None:
        return False
    shape = [size if isinstance(size, int) else -1 for size in source.meta["val"].shape[:2]] + [1]
    with gm.graph.inserting_before(node):
        pooled_input = emit(gm, node, torch.ops.aten.unsqueeze.default, source, -1)
        pooled = emit(gm, node, torch.ops.aten.mean.dim, pooled_input, [2, 3], True)
        reshaped = emit(gm, node, torch.ops.aten.view.default, pooled, shape)
    node.replace_all_uses_with(reshaped)
    gm.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch.xnnpack")
def _fix_reshape_one_dynamic_dim_inferred(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Writes a ``view``/``reshape`` (or a non-trailing ``unsqueeze``) with one dynamic output size as static sizes
    and ``-1``.

    **Why**: XNNPACK takes a reshape with int sizes and one ``-1`` only, an ``unsqueeze`` at the last dim only: each
    attention's ``view(*input_shape, -1, head_dim)`` (``[1, s, -1, 64]``) and the rotary ``cos.unsqueeze(1)`` ran on
    portable kernels between two partitions (bench_generation's 8-layer Llama: 26 delegate calls a step, 10 with
    ``_fix_rotary_cat_as_linear`` too).
    **Upstream**: none found (``ViewCopyConfig``, ``UnsqueezeCopyConfig``).
    **Remove when**: XNNPACK's partitioner takes a reshape with one symbolic size and ``unsqueeze`` at any dim.
    """
    if node.op != "call_function":
        return False
    out = value(node)
    if node.target is aten.unsqueeze.default and isinstance(out, torch.Tensor) and node.args[1] not in (-1, out.dim() - 1):
        shape = [size if isinstance(size, int) else None for size in out.shape]  # not ints: rewritten below
    elif node.target in (aten.view.default, aten.reshape.default):
        shape = node.args[1]
    else:
        return False
    if not isinstance(shape, list | tuple) or all(isinstance(size, int) for size in shape) \
            or not isinstance(out, torch.Tensor) or len(shape) != out.dim():
        return False
    dynamic = [i for i, size in enumerate(out.shape) if not isinstance(size, int)]
    if len(dynamic) != 1 or 0 in out.shape[:dynamic[0]] + out.shape[dynamic[0] + 1:]:  # -1 of 0 elements: ambiguous
        return False
    if node.target is aten.unsqueeze.default:
        node.target = aten.reshape.default
    node.args = (node.args[0], [-1 if i == dynamic[0] else size for i, size in enumerate(out.shape)])
    return True


def _dynamic_last_dim_source(arg: object, rank: int | None = None) -> torch.fx.Node | None:
    """``arg`` when it is a node of a float tensor whose last dim is static and some other dim dynamic."""
    x = value(arg)
    if not isinstance(arg, torch.fx.Node) or not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point \
            or x.dim() == 0 or not isinstance(x.shape[-1], int) or all(isinstance(size, int) for size in x.shape):
        return None
    return arg if rank is None or x.dim() == rank else None


def _last_dim_halves(high: object, low: object) -> torch.fx.Node | None:
    """The ``x`` of ``high = x[..., h:]`` and ``low = x[..., :h]`` (``aten.slice``, step 1) with ``x``'s last dim
    ``2 * h``, else None."""
    if not (isinstance(high, torch.fx.Node) and isinstance(low, torch.fx.Node) and high.target is aten.slice.Tensor
            and low.target is aten.slice.Tensor and high.args[0] is low.args[0]):
        return None
    source = _dynamic_last_dim_source(high.args[0])
    if source is None or value(source).shape[-1] % 2:
        return None
    rank, half = value(source).dim(), value(source).shape[-1] // 2

    def bounds(node: torch.fx.Node) -> tuple[object, object, object, object]:
        dim, start, end, step = (list(node.args[1:]) + [0, None, None, 1][len(node.args) - 1:])[:4]
        return dim, start, end, step

    (high_dim, high_start, high_end, high_step), (low_dim, low_start, low_end, low_step) = bounds(high), bounds(low)
    if high_dim not in (-1, rank - 1) or low_dim not in (-1, rank - 1) or high_step != 1 or low_step != 1:
        return None
    if high_start != half or low_start not in (0, None) or low_end != half \
            or not (high_end is None or (isinstance(high_end, int) and high_end >= 2 * half)):
        return None
    return source


def _last_dim_cat_as_matrix(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.Tensor] | None:
    """``(x, weight)`` with ``linear(x, weight)`` equal to ``node`` where ``node`` is one of rotary embeddings' two
    concatenations along the last dim of a dynamically shaped ``x``: ``cat([x, x], -1)`` (the angles repeated) or
    ``cat([-x[..., h:], x[..., :h]], -1)`` (``rotate_half``); else None."""
    if node.op != "call_function" or node.target is not aten.cat.default or len(node.args[0]) != 2:
        return None
    first, second = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if first is second:  # cat([x, x], -1): out[j] = x[j mod h]
        source = _dynamic_last_dim_source(first)
        if source is None or dim not in (-1, value(source).dim() - 1):
            return None
        size = value(source).shape[-1]
        weight = torch.zeros(2 * size, size, dtype=value(source).dtype)
        rows = torch.arange(2 * size)
        weight[rows, rows % size] = 1.0
        return source, weight
    if not (isinstance(first, torch.fx.Node) and first.target is aten.neg.default):
        return None
    source = _last_dim_halves(first.args[0], second)
    if source is None or dim not in (-1, value(source).dim() - 1):
        return None
    size, half = value(source).shape[-1], value(source).shape[-1] // 2
    weight = torch.zeros(size, size, dtype=value(source).dtype)  # linear: out[j] = sum_k x[k] * weight[j, k]
    rows = torch.arange(half)
    weight[rows, rows + half] = -1.0  # out[j] = -x[j + half] for j < half
    weight[rows + half, rows] = 1.0  # out[j + half] = x[j]
    return source, weight


def _first_parameter(program: torch.export.ExportedProgram, gm: torch.fx.GraphModule, name: str,
                     weight: torch.Tensor) -> torch.fx.Node:
    """A parameter placeholder named ``name`` holding ``weight``, before the program's first input (delegated like a
    weight), or the one made already by that name. ExecuTorch's ``create_constant_placeholder`` does this but takes
    the fake mode from the graph's first node, which fails when that is a torchao quantized weight
    (``IntxUnpackedToInt8Tensor``, ``quantize="8da4w"`` with a 4-bit embedding: "object has no attribute
    'fake_mode'"): the mode here is that of the first placeholder holding a FakeTensor."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    existing = next((n for n in placeholders if n.meta.get("requested_name", n.name) == name), None)
    if existing is not None:
        return existing
    mode = next(v.fake_mode for n in placeholders if isinstance(v := n.meta.get("val"), FakeTensor))
    with gm.graph.inserting_before(placeholders[0]):
        node = gm.graph.create_node(op="placeholder", name=name, target=name)
    node.target = node.name
    node.meta["requested_name"] = name
    node.meta["val"] = mode.from_tensor(weight, static_shapes=True)
    program.state_dict[node.name] = torch.nn.Parameter(weight, requires_grad=False)
    program.graph_signature.input_specs.insert(0, InputSpec(InputKind.PARAMETER, TensorArgument(node.name),
                                                            node.name, None))
    return node


@register_fx_node_fix("executorch.xnnpack")
def _fix_rotary_cat_as_linear(gm: torch.fx.GraphModule, node: torch.fx.Node,
                              ctx: ExportContext | None = None) -> bool:
    """Rewrites rotary embeddings' ``rotate_half(x)`` (``cat([-x2, x1], -1)``) and ``cat([freqs, freqs], -1)`` of a
    dynamically shaped tensor as a ``linear`` with a constant 0/+-1 matrix (a parameter, delegated like a weight).

    **Why**: XNNPACK takes ``slice_copy`` only with static shapes, so each query's and key's slices ran on portable
    kernels between two partitions: one more delegate call per decoder layer. The linear is exact (one input times
    +-1 plus zeros per output) and costs ``d * d`` multiply-adds per row (64 x 64 per head).
    **Upstream**: none found (XNNPACK's static slice has fixed sizes; ``SliceCopyConfig`` refuses dynamic shapes).
    **Remove when**: XNNPACK's partitioner takes a slice of a static dim of a dynamically shaped tensor.
    """
    program = getattr(ctx, "program", None)
    if program is None or gm is not program.graph_module:
        return False
    found = _last_dim_cat_as_matrix(node)
    if found is None:
        return False
    source, weight = found
    name = "hfexport_rotary_" + "_".join(map(str, weight.shape)) + ("_rotate" if weight.min() < 0 else "_repeat")
    matrix = _first_parameter(program, gm, name, weight)
    with gm.graph.inserting_before(node):
        rotated = emit(gm, node, aten.linear.default, source, matrix)
    node.replace_all_uses_with(rotated)
    gm.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_sym_pow(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``operator.pow(s, k)`` on a SymInt, ``k`` a small int, by ``s * s * ...``.

    **Why**: ``executorch_prim`` has no ``pow``: ``x.new_zeros(s ** 2)`` fails with ``invalid target for call_function
    <built-in function pow>``.
    **Upstream**: pytorch/executorch#11988 (the same gap for ``sym_max``); none found for ``pow``.
    **Remove when**: ``executorch_prim`` has ``pow.Scalar``.
    """
    if node.op != "call_function" or node.target not in (operator.pow, pow) or len(node.args) != 2:
        return False
    base, exponent = node.args
    if not isinstance(base, torch.fx.Node) or not is_symint_arg(base) or isinstance(exponent, bool) \
            or not isinstance(exponent, int) or not 1 <= exponent <= 8:
        return False
    replace_with_chain(gm, node, operator.mul, [base] * exponent)
    return True


@register_fx_node_fix("executorch")
def _fix_patchify_conv3d_as_linear(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Rewrites a 3-D convolution whose kernel covers its whole input (a patch embedding) as the linear layer it is.

    **Why**: the portable ``convolution.out`` takes 3-D and 4-D inputs only ("Expect input tensor to be 3-D or 4-D,
    but got, 5", 0x12), XNNPACK 1-d and 2-d convolutions: a vision tower with Qwen2-VL's ``PatchEmbed`` could not run.
    **Upstream**: none found (``check_convolution_args`` in ``kernels/portable/cpu/util/kernel_ops_util.cpp``).
    **Remove when**: ExecuTorch runs ``convolution.out`` on 5-D inputs.
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.convolution.default, aten.conv3d.default):
        return False
    args = list(node.args) + [None] * 9
    source, weight, bias = args[0], args[1], args[2]
    if node.target is aten.convolution.default:
        padding, transposed, groups = args[4], args[6], args[8]
    else:
        padding, transposed, groups = node.kwargs.get("padding", args[4] or 0), False, args[6] or 1
    shape, kernel = value(source).shape if isinstance(source, torch.fx.Node) else None, value(weight).shape
    if shape is None or len(shape) != 5 or transposed or groups != 1 \
            or any(p != 0 for p in ([padding] if isinstance(padding, int) else padding or [0])) \
            or not all(isinstance(size, int) for size in shape[1:]) or tuple(shape[1:]) != tuple(kernel[1:]):
        return False
    features = kernel[1] * kernel[2] * kernel[3] * kernel[4]
    with gm.graph.inserting_before(node):
        flat = emit(gm, node, aten.view.default, source, [-1, features])
        matrix = emit(gm, node, aten.view.default, weight, [kernel[0], features])
        linear = emit(gm, node, aten.linear.default, flat, matrix, bias)
        out = emit(gm, node, aten.view.default, linear, [-1, kernel[0], 1, 1, 1])
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_sym_floor_mod(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Makes ``a % k`` on a SymInt that may be negative floor as Python's does: ``(a % k + k) % k``.

    **Why**: ``executorch_prim::mod.Scalar`` is C++'s truncating ``%``: ``pad = (-h) % window`` (ViTDet, SAM2's Hiera,
    EdgeTAM) was -1 at every size that needs a pad (``Padding values must be non-negative``, 0x12).
    **Upstream**: none found (``kernels/prim_ops/register_prim_ops.cpp``: ``floordiv.Scalar`` floors, ``mod`` does
    not).
    **Remove when**: ``executorch_prim::mod.Scalar`` takes the divisor's sign (the test's odd size runs with it
    disabled).
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if node.op != "call_function" or node.target is not operator.mod or len(node.args) != 2 \
            or node.meta.get("hfexport_floor_mod"):
        return False
    dividend, divisor = node.args
    if not isinstance(value(dividend), torch.SymInt) or isinstance(divisor, bool) or not isinstance(divisor, int) \
            or divisor <= 0 or statically_known_true(value(dividend) >= 0):
        return False
    node.meta["hfexport_floor_mod"] = True  # the inner remainder; not rewritten again
    users = list(node.users)
    with gm.graph.inserting_after(node):
        shifted = emit(gm, node, operator.add, node, divisor)
    with gm.graph.inserting_after(shifted):
        floored = emit(gm, node, operator.mod, shifted, divisor)
    for user in users:
        user.replace_input_with(node, floored)
    return True


@register_fx_node_fix("executorch")
def _fix_negative_constant_pad(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces a constant ``pad`` with negative amounts (a crop) by ``slice`` ops, then the pad of the rest.

    **Why**: the portable ``constant_pad_nd`` refuses negative amounts (``Padding values must be non-negative``,
    0x12): RWKV shifts its sequence with ``nn.ZeroPad2d((0, 0, 1, -1))`` and failed at the traced shape.
    **Upstream**: none found (``check_constant_pad_args`` in ``kernels/portable/cpu/util/kernel_ops_util.cpp``).
    **Remove when**: the portable kernel crops on negative padding (a tiny RWKV exports with it disabled).
    """
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.pad.default, aten.constant_pad_nd.default):
        return False
    if node.target is aten.pad.default and (node.args[2] if len(node.args) > 2 else node.kwargs.get(
            "mode", "constant")) != "constant":
        return False
    source, amounts = node.args[0], node.args[1]
    if not all(isinstance(a, int) for a in amounts) or min(amounts, default=0) >= 0:
        return False
    rank = value(source).dim()
    cut = source
    with gm.graph.inserting_before(node):
        for i in range(0, len(amounts), 2):
            before, after = amounts[i], amounts[i + 1]
            if before < 0 or after < 0:  # amounts go from the last dim backwards, (before, after) each
                dim = rank - 1 - i // 2
                cut = emit(gm, node, aten.slice.Tensor, cut, dim, max(0, -before), after if after < 0 else None)
    node.replace_input_with(source, cut)
    node.args = (cut, [max(0, a) for a in amounts], *node.args[2:])
    return True


@register_fx_node_fix("executorch")
def _fix_view_as_reshape(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``aten.view`` by ``aten.reshape`` before ``to_edge``, which re-traces the program.

    **Why**: the re-trace decomposes SDPA with other output strides than the traced kernel's, and a ``view`` recorded
    on the traced layout fails: ``Cannot view a tensor with shape [s, n, 4, 16] and strides ...`` (Data2Vec-Vision,
    AfMoE).
    **Upstream**: pytorch/pytorch#136543 (the SDPA decomposition's strides); ExecuTorch's Arm backend does the same
    (pytorch/executorch#15269).
    **Remove when**: ``run_decompositions`` keeps SDPA's traced strides (the tiny Data2Vec-Vision exports with it
    disabled).
    """
    if node.op != "call_function" or node.target is not torch.ops.aten.view.default:
        return False
    node.target = torch.ops.aten.reshape.default
    return True


@register_fx_node_fix("executorch")
def _fix_float_casts_to_variant_dtype(gm: torch.fx.GraphModule, node: torch.fx.Node,
                                      ctx: ExportContext | None = None) -> bool:
    """Replaces a cast to a narrower float (``bfloat16``, ``float16``) by a cast to the variant's dtype.

    **Why**: ``prepare_for_xnnpack`` moves the parameters to float32, but a model's own ``x.to(torch.bfloat16)`` stays
    and ``to_edge`` raises ``operators are taking Tensor inputs with mismatched dtypes`` (s54); XNNPACK has no
    bfloat16.
    **Upstream**: pytorch/executorch#19854 (bfloat16 in the XNNPACK delegate), pytorch/executorch#8614.
    **Remove when**: never while a variant moves the model to one dtype (casts to the variant's own dtype are kept).
    """
    preparation = executorch_state(ctx).preparation if ctx is not None else None
    dtype = getattr(preparation, "dtype", None)
    if node.op != "call_function" or dtype is None or not dtype.is_floating_point:
        return False
    if node.target is aten._to_copy.default and node.kwargs.get("dtype") in (torch.bfloat16, torch.float16):
        if node.kwargs["dtype"] == dtype:
            return False
        node.kwargs = {**node.kwargs, "dtype": dtype}
    elif node.target is aten.to.dtype and len(node.args) > 1 and node.args[1] in (torch.bfloat16, torch.float16):
        if node.args[1] == dtype:
            return False
        node.args = (node.args[0], dtype, *node.args[2:])
    else:
        return False
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and getattr(val, "fake_mode", None) is not None:
        with val.fake_mode:
            node.meta["val"] = val.to(dtype)
    return True


@register_fx_node_fix("executorch")
def _fix_decompose_inside_control_flow(gm: torch.fx.GraphModule, node: torch.fx.Node,
                                       ctx: ExportContext | None = None) -> bool:
    """Replaces each non-Core-ATen op inside ``torch.cond`` branches (and loop bodies) by its decomposition.

    **Why**: partitioners keep ops such as ``linear`` whole for themselves but do not reach into branches, so
    ``to_edge`` fails: ``Node aten_linear_default ... was not decomposed or delegated`` (e12). The branches run on
    portable kernels.
    **Upstream**: pytorch/executorch#12270, #15364; pytorch/pytorch#143192 (the model).
    **Remove when**: ``to_edge_transform_and_lower`` decomposes or partitions inside branches (e12 lowers with it
    disabled).
    """
    from .._decompositions import decompose_in_branches, is_control_flow

    if not is_control_flow(node):
        return False
    done = decompose_in_branches(gm, node)
    if done and ctx is not None:
        ctx.note(f"decomposed inside {node.target.name()} branches (portable kernels there): "
                 + ", ".join(sorted(set(done))))
    return bool(done)


@register_fx_node_fix("executorch")
def _fix_sym_ne(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``operator.ne(a, b)`` on SymInts by ``(a - b) * (a - b) > 0``.

    **Why**: ``executorch_prim`` has no ``ne`` (``invalid target for call_function <built-in function ne>``), and
    ``sym_not(eq(a, b))`` trips the edge verifier or specialises on the trace hint.
    **Upstream**: pytorch/executorch#11988 (the same gap for ``sym_max``); none found for ``ne``.
    **Remove when**: ``executorch_prim`` has ``ne.Scalar``.
    """
    if node.op != "call_function" or node.target is not operator.ne or len(node.args) != 2:
        return False
    a, b = node.args
    if not (is_symint_arg(a) and is_symint_arg(b)) or not any(isinstance(v, torch.fx.Node) for v in (a, b)):
        return False
    with gm.graph.inserting_before(node):
        diff = emit(gm, node, operator.sub, a, b)
        new = emit(gm, node, operator.gt, emit(gm, node, operator.mul, diff, diff), 0)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_sym_ite_of_tensor_check(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``torch.sym_ite(item(t), 1, 0)`` on a one-element bool tensor by ``item(t.to(int64))``.

    **Why**: ``torch._check_tensor_all`` (LLaVA's image-token check) traces to ``sym_ite``, and the edge verifier
    accepts no Python function but ``alloc`` (a bare ``AssertionError``): LLaVA and DeepSeek-VL failed with an image.
    **Upstream**: pytorch/executorch#11988 (the same gap for ``sym_max``); none found for ``sym_ite``.
    **Remove when**: the edge verifier accepts ``torch.sym_ite`` (the tiny LLaVA lowers an image with it disabled).
    """
    if node.op != "call_function" or node.target is not torch.sym_ite or len(node.args) != 3:
        return False
    condition, if_true, if_false = node.args
    if not (isinstance(condition, torch.fx.Node) and condition.target is torch.ops.aten.item.default
            and (if_true, if_false) == (1, 0)):  # the form torch._check_tensor_all traces to
        return False
    tensor = condition.args[0]
    fake = value(tensor)
    if not isinstance(fake, torch.Tensor) or fake.dtype is not torch.bool or fake.numel() != 1:
        return False
    with gm.graph.inserting_before(node):
        as_int = gm.graph.call_function(torch.ops.aten._to_copy.default, (tensor,), {"dtype": torch.int64})
        as_int.meta = {k: v for k, v in tensor.meta.items() if k != "val"}
        as_int.meta["val"] = fake.to(torch.int64)
        flag = gm.graph.call_function(torch.ops.aten.item.default, (as_int,))
        flag.meta = dict(node.meta)  # the sym_ite's SymInt: the same value, 1 or 0
    node.replace_all_uses_with(flag)
    gm.graph.erase_node(node)
    if not condition.users:
        gm.graph.erase_node(condition)
    return True


def _assertion_only_users(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The graph assertions that ``node``'s results reach, if they reach nothing else; else ``None``.

    The path to an assertion may go through ``getitem`` (a tuple result), ``sym_size``/``sym_numel`` and Python
    symbolic arithmetic and comparisons (``operator.ge``, ``operator.eq`` ... on ``SymInt``/``SymBool``).
    """
    asserts: list[torch.fx.Node] = []
    seen: set[torch.fx.Node] = set()
    pending = list(node.users)
    while pending:
        user = pending.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op != "call_function":
            return None
        if user.target in GRAPH_ASSERTS:
            asserts.append(user)
            continue
        passes_size_only = (user.target in (operator.getitem, torch.ops.aten.sym_size.int,
                                            torch.ops.aten.sym_numel.default)
                            or (getattr(user.target, "__module__", None) == "_operator"
                                and isinstance(user.meta.get("val"), (torch.SymInt, torch.SymBool))))
        if not passes_size_only:
            return None
        pending.extend(user.users)
    return asserts


@register_fx_node_fix("executorch")
def _fix_assertion_only_non_core_op(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Removes the graph assertions on a non-Core-ATen op's result size where nothing else uses it; the op then goes.

    **Why**: the BART family checks ``unique_consecutive(...).numel() == 1``, and ``to_edge`` rejects the op (``not in
    Core ATen``; no portable kernel). ExecuTorch drops every graph assertion before emission anyway.
    **Upstream**: pytorch/executorch#11320; its ``RemoveGraphAssertsPass`` runs only after ``to_edge``'s verifier.
    **Remove when**: ``to_edge`` removes graph assertions before it verifies the opset.
    """
    target = node.target
    if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten"
            or torch.Tag.core in target.tags or not node.users):
        return False
    asserts = _assertion_only_users(node)
    if not asserts:
        return False
    for assertion in asserts:
        gm.graph.erase_node(assertion)
    return True


@register_fx_node_fix("executorch")
def _fix_sym_sum(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``torch.sym_sum([a, b, c])`` by ``a + b + c``.

    **Why**: ``to_edge`` fails with ``Unsupported target type: <function sym_sum>``; torch emits it for sums of sizes.
    **Upstream**: pytorch/executorch#11988 (the same gap for ``sym_max``); none found for ``sym_sum``.
    **Remove when**: ExecuTorch maps ``torch.sym_sum``.
    """
    if node.op != "call_function" or node.target is not torch.sym_sum or not node.args:
        return False
    operands = list(node.args[0])
    if not operands:
        return False
    replace_with_chain(gm, node, operator.add, operands)
    return True


@register_fx_node_fix("executorch")
def _fix_pow_small_int_exponent(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replaces ``aten.pow.Tensor_Scalar(x, k)`` for k in {3, 4} (or 2.0, 3.0, 4.0) by a chain of ``aten.mul``.

    **Why**: for delegation: XNNPACK takes ``pow`` with the int exponent 2 only, so GPT-2's ``pow(x, 3.0)`` stayed on
    a portable kernel and split the delegate around it.
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

    **Why**: ``to_edge``'s SDPA decomposition changes the output's strides, and GPT-2's next ``view`` fails: ``Cannot
    view a tensor with shape torch.Size([2, 8, 32]) and strides (32, 64, 1)``.
    **Upstream**: pytorch/pytorch#136543, pytorch/pytorch#169732 ("Maintain contiguity in sdpa").
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
