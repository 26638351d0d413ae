"""Stage 2, Graph preparation: ``@register_fx_node_fix("openvino")`` rewrites of the program decomposed with OpenVINO's
table (the step ``ExportedProgram.run_decompositions``), before ``openvino.convert_model``."""

from __future__ import annotations

from typing import Any

from hfexport.plugin import register_fx_node_fix

from .._graph import call_with_meta, scan_as_while_loop

__all__: list[str] = []


@register_fx_node_fix("openvino")
def _fix_cat_legacy_empty(gm: Any, node: Any) -> bool:
    """Drops from ``aten.cat`` its 1-D empty inputs beside inputs of more dims, as torch's legacy rule does.

    **Why**: transformers' ``DynamicLayer`` starts its cache as ``torch.tensor([])``; T5's seq2seq decode step failed
    in the conversion: ``Axis -2 out of the tensor rank range [-1, 0]`` (``aten.cat.default``).
    **Upstream**: none found (OpenVINO's ``src/frontends/pytorch/src/op/cat.cpp``); model-side, transformers'
    ``DynamicLayer.lazy_initialization``.
    **Remove when**: a tiny T5 ``text2text-generation`` export converts with ``disable=("_fix_cat_legacy_empty",)``.
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
def _fix_sdpa_enable_gqa_as_repeated_heads(gm: Any, node: Any) -> bool:
    """``sdpa(q, k, v, enable_gqa=True)`` → ``sdpa(q, repeat_interleave(k, g, -3), repeat_interleave(v, g, -3))``
    with ``g`` = query heads / key-value heads (static), as eager broadcasts the groups; then
    ``_fix_sdpa_fully_masked_rows`` on the same node (registered before it, as a fix consumes its node).

    **Why**: the FX decoder drops ``enable_gqa``: a 4-query / 2-key-value-head attention converted, then failed at
    inference: ``Incompatible MatMul batch dimension. Cant merge the first input dimension=4 with second input
    dimension=2``.
    **Upstream**: none found (OpenVINO's ``src/frontends/pytorch/src/op/scaled_dot_product_attention.cpp``).
    **Remove when**: ``test_sdpa_enable_gqa`` matches with ``disable=("_fix_sdpa_enable_gqa_as_repeated_heads",)``.
    """
    import torch

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default \
            or not node.kwargs.get("enable_gqa"):
        return False
    q, k, v = node.args[:3]
    shapes = [x.meta.get("val").shape if isinstance(x, torch.fx.Node) and "val" in x.meta else None for x in (q, k, v)]
    if any(s is None or len(s) < 3 for s in shapes) \
            or not all(isinstance(s[-3], int) for s in shapes) or shapes[0][-3] % shapes[1][-3] \
            or shapes[1][-3] != shapes[2][-3]:
        return False  # dynamic or uneven head counts: left as is
    groups = shapes[0][-3] // shapes[1][-3]
    if groups > 1:
        graph = gm.graph
        with graph.inserting_before(node):
            k = _call(graph, aten.repeat_interleave.self_int, (k, groups, -3), {}, k)
            v = _call(graph, aten.repeat_interleave.self_int, (v, groups, -3), {}, v)
    node.args = (q, k, v, *node.args[3:])
    node.kwargs = {key: value for key, value in node.kwargs.items() if key != "enable_gqa"}
    _fix_sdpa_fully_masked_rows(gm, node)  # a fix that returns True consumes the node: the next one runs here
    return True


@register_fx_node_fix("openvino")
def _fix_integer_shift_as_arithmetic(gm: Any, node: Any) -> bool:
    """``x >> k`` → ``floor_divide(x, 2 ** k)`` and ``x << k`` → ``x * 2 ** k`` on integer tensors (arithmetic shift:
    floor division for negatives too; a product wraps as the shift does).

    **Why**: the FX decoder has no rule for ``aten.__rshift__`` / ``bitwise_right_shift``: e06's int4 nibbles
    (``packed >> 4``) failed in ``convert_model`` (``OpConversionFailure``, unconverted ops).
    **Upstream**: none found (``src/frontends/pytorch/src/op_table.cpp``; ONNX's and ExecuTorch's own workarounds:
    microsoft/onnxscript#258, pytorch/executorch#15673).
    **Remove when**: e06 converts on openvino with ``disable=("_fix_integer_shift_as_arithmetic",)``.
    """
    import torch

    aten = torch.ops.aten
    right = (aten.__rshift__.Scalar, aten.__rshift__.Tensor, aten.bitwise_right_shift.Tensor,
             aten.bitwise_right_shift.Tensor_Scalar)
    left = (aten.__lshift__.Scalar, aten.__lshift__.Tensor, aten.bitwise_left_shift.Tensor,
            aten.bitwise_left_shift.Tensor_Scalar)
    if node.op != "call_function" or node.target not in right + left:
        return False
    x, k = node.args[:2]
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if value is None or value.dtype not in (torch.uint8, torch.int32, torch.int64):
        return False  # int8 / int16 left shifts would need a wrap the CPU plugin's saturating Convert does not do
    dtype, graph = value.dtype, gm.graph
    with graph.inserting_before(node):
        if isinstance(k, torch.fx.Node):
            factor = _call(graph, aten.pow.Scalar, (2, k), {}, k)
            factor = _call(graph, aten._to_copy.default, (factor,), {"dtype": dtype}, k)
        else:
            factor = _call(graph, aten.scalar_tensor.default, (2 ** int(k),), {"dtype": dtype}, x)
        if node.target in right:
            if dtype != torch.uint8:  # floor, not truncation, for negatives: (x - (f - 1)) / f truncated when x < 0
                negative = _call(graph, aten.lt.Scalar, (x, 0), {}, x)
                less = _call(graph, aten.sub.Tensor, (factor, 1), {}, x)
                zero = _call(graph, aten.scalar_tensor.default, (0,), {"dtype": dtype}, x)
                x = _call(graph, aten.sub.Tensor, (x, _call(graph, aten.where.self, (negative, less, zero), {}, x)),
                          {}, x)
            else:  # the CPU plugin's uint8 division rounds (255 / 16 gave 16): divide in int32
                x = _call(graph, aten._to_copy.default, (x,), {"dtype": torch.int32}, x)
                factor = _call(graph, aten._to_copy.default, (factor,), {"dtype": torch.int32}, x)
            new = _call(graph, aten.div.Tensor_mode, (x, factor), {"rounding_mode": "trunc"}, x)
            if dtype == torch.uint8:
                new = _call(graph, aten._to_copy.default, (new,), {"dtype": torch.uint8}, x)
        elif dtype == torch.uint8:  # wrap at 8 bits: the product in int32, its low byte
            wide = _call(graph, aten._to_copy.default, (x,), {"dtype": torch.int32}, x)
            wide_factor = _call(graph, aten._to_copy.default, (factor,), {"dtype": torch.int32}, x)
            product = _call(graph, aten.mul.Tensor, (wide, wide_factor), {}, x)
            low = _call(graph, aten.bitwise_and.Scalar, (product, 255), {}, x)
            new = _call(graph, aten._to_copy.default, (low,), {"dtype": torch.uint8}, x)
        else:
            new = _call(graph, aten.mul.Tensor, (x, factor), {}, x)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return True


@register_fx_node_fix("openvino")
def _fix_repeat_interleave_tensor_along_dim(gm: Any, node: Any) -> bool:
    """``repeat_interleave(x, repeats, dim)`` with a tensor of repeats → ``index_select(x, dim, idx)``, ``idx`` =
    ``repeat_interleave(arange(x.size(dim)), repeats)`` (the form without ``dim``, which OpenVINO converts right).

    **Why**: with ``dim`` the translation takes ``repeats`` for one number and tiles by ``[*repeats, 1]``: a ``Tile``
    of dynamic rank, refused by ``compile_model`` (c01; Qwen3-VL's and GLM-4V's ``video_grid_thw`` rows).
    **Upstream**: none found for OpenVINO; openvinotoolkit/openvino#29380 added tensor repeats without ``dim``.
    **Remove when**: c01 runs on openvino with ``disable=("_fix_repeat_interleave_tensor_along_dim",)``.
    """
    import torch

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.repeat_interleave.self_Tensor or len(node.args) < 2:
        return False
    x, repeats = node.args[:2]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if dim is None or value is None or not isinstance(repeats, torch.fx.Node) or value.dim() == 0:
        return False  # without dim: OpenVINO's own translation is right
    dim, graph = dim % value.dim(), gm.graph
    with graph.inserting_before(node):
        size = value.shape[dim]
        if not isinstance(size, int):
            size = _call(graph, aten.sym_size.int, (x, dim), {}, x)
        rows = _call(graph, aten.arange.start_step, (0, size, 1), {"dtype": torch.int64}, x)
        index = _call(graph, aten.repeat_interleave.self_Tensor, (rows, repeats), {}, x)
        new = _call(graph, aten.index_select.default, (x, dim, index), {}, x)
    new.meta["val"] = node.meta.get("val", new.meta.get("val"))  # the unbacked length its users were traced with
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return True


@register_fx_node_fix("openvino")
def _fix_masked_select_as_gather(gm: Any, node: Any) -> bool:
    """``masked_select(x, mask)`` → ``x.flatten()[nonzero(mask.flatten())]`` (mask broadcast to ``x`` first).

    **Why**: the FX decoder has no rule for ``aten.masked_select``: e10's thresholded scores failed in
    ``convert_model`` (``OpConversionFailure``, unconverted ops).
    **Upstream**: none found (``src/frontends/pytorch/src/op_table.cpp``; ONNX's: microsoft/onnxscript#1675).
    **Remove when**: e10 converts on openvino with ``disable=("_fix_masked_select_as_gather",)``.
    """
    import torch

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.masked_select.default:
        return False
    x, mask = node.args[:2]
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    mv = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else None
    if xv is None or mv is None or tuple(xv.shape) != tuple(mv.shape) \
            or not (xv.is_contiguous() and mv.is_contiguous()):
        return False  # broadcasting masks, strided views (aten.reshape has no rule either): left as is
    graph = gm.graph
    with graph.inserting_before(node):
        flat_x = _call(graph, aten.view.default, (x, [-1]), {}, x)
        flat_mask = _call(graph, aten.view.default, (mask, [-1]), {}, mask)
        where = _call(graph, aten.nonzero.default, (flat_mask,), {}, mask)
        index = _call(graph, aten.squeeze.dim, (where, 1), {}, mask)
        new = _call(graph, aten.index_select.default, (flat_x, 0, index), {}, x)
    new.meta["val"] = node.meta.get("val", new.meta.get("val"))  # the unbacked length its users were traced with
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return True


@register_fx_node_fix("openvino")
def _fix_sdpa_fully_masked_rows(gm: Any, node: Any) -> bool:
    """``sdpa(q, k, v, mask)`` → ``where(any(visible(mask), -1), sdpa(...), 0)``: zeros for rows that see no key.

    **Why**: OpenVINO's CPU ``ScaledDotProductAttention`` returns NaN there: a left-padded Llama's logits at the
    padding positions were NaN where eager's are finite.
    **Upstream**: none found for OpenVINO (torchlib's: microsoft/onnxscript#2479; eager's: pytorch/pytorch#103749).
    **Remove when**: a tiny Llama's left-padded batch matches eager with ``disable=("_fix_sdpa_fully_masked_rows",)``.
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
    """The leading ``None`` indices of ``aten.index_put`` as explicit broadcast ``arange`` indices (static dims).

    **Why**: OpenVINO lowers a leading ``None`` as a ``Transpose`` of the whole tensor, a ``ScatterNDUpdate`` and a
    ``Transpose`` back: the stateful KV-cache write then copied the cache twice per layer and step (15.0 of 44.0 ms).
    **Upstream**: none found (OpenVINO's ``src/frontends/pytorch/src/op/index_put_.cpp``).
    **Remove when**: a toy ``text-generation`` decode step shows no ``Transpose`` from ``index_put`` in the CPU
    plugin's performance counters with ``disable=("_fix_index_put_leading_slices",)``.
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
def _fix_symint_min_max_mod_as_tensors(gm: Any, node: Any) -> bool:
    """``sym_min``, ``sym_max`` and ``%`` of SymInts computed on 0-d int64 tensors (``meta["val"]`` kept).

    **Why**: OpenVINO's FX decoder converts only ``+ - * //`` of SymInts: ``No conversion rule found for operations:
    <built-in function mod>`` (Bamba, Falcon-H1, CANINE) or ``<function sym_min>`` (DeepSeek-V3.2, AXK2).
    **Upstream**: none found (``src/frontends/pytorch/src/op_table.cpp``).
    **Remove when**: ``sym_min``, ``sym_max`` and ``%`` of a dynamic dim convert with ``disable=`` of this fix.
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

    **Why**: OpenVINO's translation reads five inputs: ``Got less inputs 4 than expected 5`` (JetMoE's experts).
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
    """A ``higher_order.scan`` as a ``while_loop`` over the scanned dim, every operand carried: the same ops.

    **Why**: the FX frontend has no ``scan`` (``No conversion rule found for operations: scan``: Mamba, Jamba,
    RecurrentGemma, RWKV) and its ``while_loop`` miscounts ``additional_inputs``, so none is left additional.
    **Upstream**: openvinotoolkit/openvino#33173 (``while_loop`` for the FX frontend; ``scan`` not covered).
    **Remove when**: ``tests/openvino``'s scan module converts with ``disable=("_fix_scan_as_while_loop",)``.
    """
    import torch

    if node.op != "call_function" or node.target is not torch.ops.higher_order.scan:
        return False
    return scan_as_while_loop(gm, node)


@register_fx_node_fix("openvino")
def _fix_while_loop_additional_carried(gm: Any, node: Any) -> bool:
    """A ``higher_order.while_loop``'s ``additional_inputs`` carried instead: the body returns them unchanged.

    **Why**: the FX frontend's ``while_loop`` miscounts ``additional_inputs`` (the parameters of a module called in
    the body, a closure's tensors): ``Check 'body_results.size() == num_carried' failed`` (f04: a Linear in the
    body); every loop without them converts. The same body and condition: the outputs are equal.
    **Upstream**: openvinotoolkit/openvino#33173 (``while_loop`` for the FX frontend).
    **Remove when**: f04 converts on openvino with ``disable=("_fix_while_loop_additional_carried",)``.
    """
    import torch

    if node.op != "call_function" or node.target is not torch.ops.higher_order.while_loop or len(node.args) != 4:
        return False
    cond_attr, body_attr, carried, additional = node.args
    body = getattr(gm, body_attr.target, None) if body_attr.op == "get_attr" else None
    if not additional or body is None or len(body_attr.users) > 1 or "val" not in node.meta:
        return False
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    output = next(n for n in body.graph.nodes if n.op == "output")
    if len(placeholders) != len(carried) + len(additional):
        return False
    results = output.args[0] if isinstance(output.args[0], tuple | list) else (output.args[0],)
    output.args = ((*results, *placeholders[len(carried):]),)
    body.recompile()
    node.args = (cond_attr, body_attr, (*carried, *additional), ())
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in additional]
    node.meta["val"] = (*node.meta["val"], *vals)
    return True


@register_fx_node_fix("openvino")
def _fix_unique_consecutive_as_mask(gm: Any, node: Any) -> bool:
    """``torch.unique_consecutive`` of a 1-D tensor as the elements that differ from their predecessor.

    **Why**: the FX decoder has no rule for ``aten.unique_consecutive``: Qwen2.5-VL's vision windows
    (``transformers.vision_utils``) failed with an image.
    **Upstream**: none found (``src/frontends/pytorch/src/op_table.cpp``); model-side, ``transformers/vision_utils.py``.
    **Remove when**: it converts on a dynamic 1-D tensor with ``disable=("_fix_unique_consecutive_as_mask",)``.
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


@register_fx_node_fix("openvino")
def _fix_sort_ties_in_index_order(gm: Any, node: Any) -> bool:
    """``sort`` / ``argsort`` without ``stable=True`` as their stable overload: ties keep their index order.

    **Why**: torch leaves the order of ties unspecified without ``stable=True``, but its CPU kernel keeps index order,
    and OpenVINO's ``TopK`` (unstable) returned them reversed: c21's ``argsort([0.2, 0.2, 0.8, 0.4])`` gave
    ``[1, 0, 3, 2]`` where eager gives ``[0, 1, 3, 2]`` (``sort(stable=True)`` already matched).
    **Upstream**: none found (OpenVINO's ``src/frontends/pytorch/src/op/sort.cpp`` maps ``stable`` to ``TopK``'s).
    **Remove when**: c21 matches on openvino with ``disable=("_fix_sort_ties_in_index_order",)``.
    """
    import torch

    aten = torch.ops.aten
    if node.op != "call_function":
        return False
    if node.target in (aten.sort.stable, aten.argsort.stable) and node.kwargs.get("stable") is not True:
        node.kwargs = {**node.kwargs, "stable": True}
        return True
    if node.target not in (aten.sort.default, aten.argsort.default):
        return False
    names = ("dim", "descending")
    options = dict(zip(names, node.args[1:], strict=False), **node.kwargs)
    target = aten.sort.stable if node.target is aten.sort.default else aten.argsort.stable
    node.target = target
    node.args = (node.args[0],)
    node.kwargs = {"stable": True, "dim": options.get("dim", -1), "descending": options.get("descending", False)}
    return True


def _call(graph: Any, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], like: Any) -> Any:
    """A new ``call_function`` node of ``op``, its ``meta["val"]`` computed on the fake tensors of its inputs (in
    ``like``'s fake mode, else the graph's: ``like`` may be a SymInt node)."""
    return call_with_meta(graph, op, args, kwargs, getattr(like.meta.get("val"), "fake_mode", None))
