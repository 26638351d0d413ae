"""ExecuTorch's stage 3, ExecuTorch patches: ``@register_patch("executorch.internals", ...)`` for ExecuTorch (and
torch.export) internals that fail, or cost too much, on valid programs; installed while tracing and lowering.

Each is an upstream bug or gap worked around until the fix named in its **Remove when**; ``disable=("<name>",)``
leaves one out. The tests: ``tests/executorch/test_executorch_workarounds.py``, ``test_executorch_scan.py`` and
``test_executorch_export_cost.py``.
"""

from __future__ import annotations

import copy
import functools
import heapq
from typing import Any

import torch

from hfexport.plugin import ExportContext, register_patch

from .._bounds import DEFAULT_DIM_UPPER_BOUND, _other_bound
from .._buffers import mutated_buffer_initial_value
from .._config import executorch_config
from .._decompositions import ET_DECOMPOSITIONS, rejected_ops_with_decomposition, unsupported_op_message
from .._delegation import STRICT, portable_kernel_for
from .._graph import GRAPH_ASSERTS, value
from .._state import executorch_state

__all__: list[str] = []


@register_patch("executorch.internals", "executorch.exir.passes.replace_view_copy_with_view_pass._is_view_copy")
def _patch_view_larger_than_base(original: Any) -> Any:
    """Keeps a ``view_copy`` a copy where its planned size exceeds its base's or its dynamism differs.

    **Why**: ``to_executorch`` plans a view inside its base's memory, each at its upper bounds: the BART family's
    ``hidden[eos_mask].view(b, -1, h)`` plans 4x its base (``size_bytes (32768) >= allocator size (16896)``, load
    error 0x21); a dynamic view of a static base fails ``_ViewSpec is incompatible with its base`` (EXAONE 4.5).
    **Upstream**: none found (``exir/passes/replace_view_copy_with_view_pass.py``).
    **Remove when**: the view pass or memory planning bounds a view by its base (the test's module loads with it
    disabled).
    """
    from executorch.exir.sym_util import eval_shape_upper_bound
    from executorch.exir.tensor import determine_tensor_dynanism, num_bytes_from_shape_and_dtype

    def planned_bytes(node: Any) -> int | None:
        fake = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(fake, torch.Tensor):
            return None
        try:
            return num_bytes_from_shape_and_dtype(torch.Size(eval_shape_upper_bound(fake.shape)), fake.dtype)
        except Exception:  # an unbounded size: the planner fails on it by itself, with its own message
            return None

    @functools.wraps(original)
    def _is_view_copy(node: torch.fx.Node) -> bool:
        if not original(node):
            return False
        if _dynamism(node) != _dynamism(node.args[0]):
            return False
        view, base = planned_bytes(node), planned_bytes(node.args[0])
        return view is None or base is None or view <= base

    def _dynamism(node: Any) -> Any:
        fake = value(node)
        return determine_tensor_dynanism(torch.Size(fake.shape)) if isinstance(fake, torch.Tensor) else None

    return _is_view_copy


@register_patch("executorch.internals", "executorch.exir.sym_util.eval_upper_bound",
                "executorch.exir.passes.sym_shape_eval_pass.eval_upper_bound")
def _patch_unbacked_size_upper_bound(original: Any, ctx: ExportContext | None = None) -> Any:
    """Plans a data-dependent size that lowering left unbounded at ``dim_upper_bound`` (64 by default).

    **Why**: ``to_edge`` and ``to_executorch`` retrace and give each data-dependent op a new unbacked symbol, ``[0,
    int_oo]``, which the program's bounds do not reach: ``Cannot evaluate a finite upper bound for symbolic expression
    u137`` (EXAONE 4.5 and Cosmos3-Edge with their image).
    **Upstream**: pytorch/executorch#8766 (unbounded dynamic memory is not supported).
    **Remove when**: ExecuTorch keeps the bounds of unbacked sizes through its retraces.
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    # the bound the step after stage 4 gives a program's dim with no role: the user's dim_upper_bound, else the default
    bound = _other_bound(executorch_config(ctx), 0)[0] if ctx is not None else DEFAULT_DIM_UPPER_BOUND

    @functools.wraps(original)
    def eval_upper_bound(maybe_symint: Any) -> Any:
        try:
            return original(maybe_symint)
        except RuntimeError as exc:
            node = getattr(maybe_symint, "node", None)
            if "finite upper bound" not in str(exc) or node is None or not free_unbacked_symbols(node.expr):
                raise
            ranges = dict(node.shape_env.var_to_range)
            for symbol in free_unbacked_symbols(node.expr):  # u137 + 1: each unbounded unbacked symbol <= bound
                known = ranges.get(symbol)
                if known is None or known.upper in (int_oo, -int_oo):
                    lower = 0 if known is None or known.lower in (int_oo, -int_oo) else max(int(known.lower), 0)
                    ranges[symbol] = ValueRanges(min(lower, bound), bound)
            upper = bound_sympy(node.expr, ranges).upper
            if not upper.is_Integer:
                raise
            return int(upper)

    return eval_upper_bound


@register_patch("executorch.internals", "executorch.exir.sym_util.bound_sympy")
def _patch_exact_quotient_upper_bound(original: Any) -> Any:
    """Bounds a size ``a // b`` by its exact quotient where ``b`` divides ``a`` as polynomials.

    **Why**: ``bound_sympy`` takes the largest numerator over the smallest denominator, and torch's ``FloorDiv`` does
    not cancel ``T * T`` when ``T`` is a sum: SEW-D's attention planned a [2244004, 4, 749, 749] buffer (18,759 GiB)
    at a batch of 16 and 30 s of audio; 735 MiB with the patch.
    **Upstream**: none found (``exir/sym_util.py``'s ``eval_upper_bound``; torch's ``FloorDiv.eval``).
    **Remove when**: torch simplifies such a view's inferred size (``b``), or ExecuTorch bounds it exactly.
    """
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    def exact(node: Any) -> Any:
        """``a // b`` as the polynomial ``a / b`` when that has integer coefficients: then they are equal (``b``
        divides ``a``; a zero ``b`` would have failed the op that made the size); else as it is."""
        try:
            quotient = sympy.cancel(node.args[0] / node.args[1])
            if sympy.fraction(quotient)[1] != 1:
                return node
            coefficients = sympy.Poly(quotient).coeffs() if quotient.free_symbols else [quotient]
        except sympy.PolynomialError:  # not a polynomial in its atoms
            return node
        return quotient if all(c.is_Integer for c in coefficients) else node

    @functools.wraps(original)
    def bound_sympy(expr: Any, ranges: Any = None) -> Any:
        bounds = original(expr, ranges)
        if not isinstance(expr, sympy.Expr) or not expr.has(FloorDiv):
            return bounds
        exact_quotients = expr.replace(lambda node: isinstance(node, FloorDiv), exact)
        return bounds & original(exact_quotients, ranges)  # both bounds hold: their intersection

    return bound_sympy


@register_patch("executorch.internals",
                "executorch.exir.tensor.dim_order_from_stride",
                "executorch.exir.tensor_layout.dim_order_from_stride",
                "executorch.exir.emit._emitter.dim_order_from_stride",
                "executorch.exir.passes.replace_view_copy_with_view_pass.dim_order_from_stride")
def _patch_dim_order_from_stride(original: Any) -> Any:
    """Sorts strides that hold unbacked symbols without guarding: an unprovable ``a < b`` counts as False.

    **Why**: after a boolean selection (c10) a decomposed SDPA has strides such as ``(16*u0, 16, 1)``, and
    ``to_executorch`` raises ``GuardOnDataDependentSymNode: ... 16*u7 < 16``. Only when the original raises.
    **Upstream**: pytorch/executorch#19516, pytorch/executorch#4261; the pattern: pytorch/pytorch#180202, #181084.
    **Remove when**: ``dim_order_from_stride`` orders unbacked strides without guarding (c10 lowers with it disabled).
    """
    from torch.fx.experimental.symbolic_shapes import (
        GuardOnDataDependentSymNode,
        guard_or_false,
        guard_or_true,
    )

    def less(a: Any, b: Any) -> bool:  # the divisibility rule still proves 16 < 16*u0
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

    **Why**: ``EdgeOpArgValidator`` took a ``split_with_sizes_copy``'s first tensor for the list and called ``len`` on
    it, which guards the dynamic batch to its traced value: GPT-2 traced at batch 2 failed at 3 (``Attempted to resize
    a static tensor``, 0x12).
    **Upstream**: none found (``exir/verification/arg_validator.py``); the runtime symptom of pytorch/executorch#1350.
    **Remove when**: the validator wraps single list returns itself (the test's batch 3 runs with it disabled).
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


@register_patch("executorch.internals", "executorch.exir.emit._emitter._Emitter._emit_scan")
def _patch_scan_buffers_resized(original: Any) -> Any:
    """Sizes a ``scan``'s carry and stacked outputs from the run's values, not from the memory plan.

    **Why**: the emitted loop fills them with ``copy_`` and ``et_copy_index``, which resize no dim but the scanned
    one: Mamba's selective scan with a dynamic batch failed even at the traced shape (``op_copy.cpp``, 0x12).
    **Upstream**: none found (``exir/emit/_emitter.py``'s ``_emit_scan``, unchanged on main).
    **Remove when**: the emitter sizes the scan buffers itself (the tiny Mamba runs a dynamic batch with it disabled).
    """
    from executorch.exir.schema import Bool, EValue, Instruction, Int, JumpFalseCall, KernelCall, Null

    # The carry is initialized with clone.out (which resizes it to init), and at the first step only the step's
    # output is written with unsqueeze_copy.out (which resizes the stacked buffer to [1, *step]) before
    # et_copy_index copies it again; the later steps grow dim 0 as before.
    @functools.wraps(original)
    def emit_scan(self: Any, args: Any, subemitter_binding_output_values: Any) -> Any:
        start = len(self.chain.instructions)
        result = original(self, args, subemitter_binding_output_values)
        init_ids = {value.id for value in args[1]}
        copy_index, _ = self._get_operator(name="aten::copy_")
        clone_index, _ = self._get_operator(name="aten::clone", overload="out")
        copy_at_index, _ = self._get_operator(name="executorch_prim::et_copy_index", overload="tensor")
        unsqueeze_index, _ = self._get_operator(name="aten::unsqueeze_copy", overload="out")
        eq_index, _ = self._get_operator(name="executorch_prim::eq", overload="Scalar")
        instructions = self.chain.instructions
        null = self._emit_evalue(EValue(Null()))
        position = start
        while position < len(instructions):
            call = instructions[position].instr_args
            if isinstance(call, KernelCall) and call.op_index == copy_index and call.args[1] in init_ids:
                carry, init = call.args[0], call.args[1]  # copy_(carry, init, non_blocking, out=carry)
                instructions[position].instr_args = KernelCall(op_index=clone_index, args=[init, null.id, carry, carry])
            elif isinstance(call, KernelCall) and call.op_index == copy_at_index:
                stacked, step, index = call.args  # et_copy_index(copy_to, copy_from, index)
                first = self._emit_evalue(EValue(Bool(False)))
                zero, dim = self._emit_evalue(EValue(Int(0))), self._emit_evalue(EValue(Int(0)))
                here = self.instruction_start_offset + position  # absolute index of the first new instruction
                instructions[position:position] = [
                    Instruction(KernelCall(op_index=eq_index, args=[index, zero.id, first.id])),
                    Instruction(JumpFalseCall(cond_value_index=first.id, destination_instruction=here + 3)),
                    Instruction(KernelCall(op_index=unsqueeze_index, args=[step, dim.id, stacked, stacked])),
                ]
                position += 3
            position += 1
        return result

    return emit_scan


@register_patch("executorch.internals",
                "executorch.exir.program._program._default_decomposition_table",
                "executorch.exir.tracer._default_decomposition_table")
def _patch_default_decomposition_table(original: Any, ctx: ExportContext | None = None) -> Any:
    """Adds every decomposition of a non-Core-ATen op (torch's, ours, the variant's) to the table ``to_edge`` uses.

    **Why**: ``to_edge`` rejects the op (``aten.sort.stable is not in Core ATen opset``, c21; the shifts of int4
    weights, e06), the exception list only moves the failure to load (``Missing operator``), and decomposing before
    lowering breaks XNNPACK's ``ConvertToLinearPass``.
    **Upstream**: pytorch/executorch#20270, #11320, #4742, #15673 (open: the shifts); apple/coremltools#2782.
    **Remove when**: ``to_edge_transform_and_lower`` takes a user table and the portable library ships ``sort`` (c21
    lowers with it disabled).
    """

    @functools.wraps(original)
    def _default_decomposition_table(*args: Any, **kwargs: Any) -> Any:
        table = original(*args, **kwargs)
        for op, fn in rejected_ops_with_decomposition().items():
            if op not in table:  # not setdefault: torch's CustomDecompTable overrides __setitem__, not setdefault
                table[op] = fn
        table.update(ET_DECOMPOSITIONS)
        preparation = executorch_state(ctx).preparation if ctx is not None else None
        table.update(getattr(preparation, "decompositions", None) or {})  # the variant's (XNNPACK_DECOMPOSITIONS)
        return table  # to_edge_transform_and_lower then pops the ops a partitioner keeps whole (XNNPACK's linear)

    return _default_decomposition_table


@register_patch("executorch.internals",
                "executorch.exir.verification.verifier.EXIRATenDialectVerifier",
                "executorch.exir.program._program.EXIRATenDialectVerifier")
def _patch_aten_dialect_verifier(original: Any, ctx: ExportContext | None = None) -> Any:
    """Lets the edge verifiers accept a non-Core-ATen aten op whose out-variant kernel the portable library has.

    **Why**: ``to_edge``'s own decompositions emit ops nobody can list beforehand: ``repeat_interleave(x, counts)``
    (c01) becomes ``aten.repeat_interleave.Tensor``, rejected though the runtime has its kernel. An op without a
    kernel is still refused, by a message that names it and what to do.
    **Upstream**: pytorch/executorch#4742; pytorch/pytorch#156873 (c01's op).
    **Remove when**: ``repeat_interleave.Tensor`` is Core ATen, or ``to_edge`` checks kernels instead of the opset.
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
                              and not op._schema.is_mutable and not getattr(STRICT, "on", False))
                if not admissible:
                    raise
                if portable_kernel_for(op) is None:  # no decomposition reached it and no kernel: say so, and what to do
                    raise SpecViolationError(unsupported_op_message(op)) from None
                if ctx is not None:
                    executorch_state(ctx).admitted_ops.append(str(op))
                return None

        cls.check_valid_op = check_valid_op  # a fresh class per call: nothing else sees this
        return verifier

    return EXIRATenDialectVerifier


@register_patch("executorch.internals", "executorch.exir.emit._emitter._TopLevelEmitter.placeholder")
def _patch_mutable_buffer_initial_state(original: Any, ctx: ExportContext | None = None) -> Any:
    """Serializes the initial value of every mutated buffer that is not all zeros (``meta["et_init_buffer"]``).

    **Why**: ExecuTorch keeps only a mutated buffer's shape and dtype: a cache pre-filled with a prefix (d12) read 0
    wherever the first call did not write, silently.
    **Upstream**: pytorch/executorch#5068, #11309 (``InitializedMutableBufferPass`` takes the names by hand).
    **Remove when**: ExecuTorch serializes mutated buffers' initial values by default (d12 matches with it disabled).
    """

    @functools.wraps(original)
    def placeholder(self: Any, target: Any, args: Any, kwargs: Any) -> Any:
        initial = mutated_buffer_initial_value(self.exported_program, target)
        if initial is not None and bool(torch.any(initial != 0)):
            spec = self.node.meta.get("spec")
            name = self.exported_program.graph_signature.inputs_to_buffers[target]
            if getattr(spec, "mem_id", None) is None or getattr(spec, "mem_offset", None) is None:
                raise RuntimeError(f"buffer {name!r} is mutated by the program and has a non-zero initial value, "
                                   "which ExecuTorch keeps only for memory-planned buffers: export with "
                                   "alloc_mutable_buffers=True, or zero the buffer and fill it in forward")
            self.node.meta["et_init_buffer"] = True
            if ctx is not None:
                executorch_state(ctx).initialized_buffers.append(name)
        return original(self, target, args, kwargs)

    return placeholder


@register_patch("executorch.internals",
                "executorch.exir.passes.remove_graph_asserts_pass.RemoveNonCoreAtenOpGraphAssertsPass.call")
def _patch_assertions_on_python_sym_functions(original: Any) -> Any:
    """Removes, in ``to_edge``'s first pass, the graph assertions whose condition a plain Python function computes.

    **Why**: ``torch._check(n != 0)`` on an unbacked size traces to ``_assert_scalar(torch.sym_not(n == 0))``
    (Idefics2/3, SmolVLM), and the edge verifier accepts no Python function but ``alloc`` (a bare ``AssertionError``);
    ExecuTorch deletes every graph assertion before emission anyway.
    **Upstream**: pytorch/executorch#11988 (the same gap for ``torch.sym_max``).
    **Remove when**: the edge verifier accepts ``torch.sym_not``.
    """
    import types

    @functools.wraps(original)
    def call(self: Any, graph_module: torch.fx.GraphModule) -> Any:
        for module in graph_module.modules():
            if not isinstance(module, torch.fx.GraphModule):
                continue
            for node in list(module.graph.nodes):
                condition = node.args[0] if node.target in GRAPH_ASSERTS and node.args else None
                if isinstance(condition, torch.fx.Node) and isinstance(condition.target, types.FunctionType):
                    module.graph.erase_node(node)
        return original(self, graph_module)  # recompiles and eliminates the dead conditions

    return call


@register_patch("executorch.internals", "executorch.exir.passes.cse_pass.CSEPass._make_hashable")
def _patch_cse_keys_nodes_apart_from_ints(original: Any) -> Any:
    """Keys a node argument in ExecuTorch's ``CSEPass`` as ``("node", number)``, apart from int literals.

    **Why**: the pass keyed nodes by their number and ints by value in one tuple, so ``arange(n)`` (``n`` the 40th
    node) and ``arange(40)`` merged: a Voxtral decoder with ``max_cache_len=40`` failed; a program can be silently
    wrong.
    **Upstream**: pytorch/executorch#17752 (the pass); none found for the collision.
    **Remove when**: ``CSEPass`` keeps node numbers apart from literals (the test lowers right with it disabled).
    """
    @functools.wraps(original)
    def _make_hashable(self: Any, obj: Any) -> Any:  # lists and dicts: the original recurses through this method
        return ("node", original(self, obj)) if isinstance(obj, torch.fx.Node) else original(self, obj)

    return _make_hashable


def _sort_in_place(graph: torch.fx.Graph) -> None:
    """Reorder ``graph``'s nodes topologically, keeping the present order wherever the dependencies allow (a
    stable Kahn sort by position); the nodes move, no graph is rebuilt."""
    position = {node: index for index, node in enumerate(graph.nodes)}
    if all(position[i] < position[node] for node in graph.nodes for i in node.all_input_nodes):
        return
    waiting = {node: len(node.all_input_nodes) for node in graph.nodes}
    ready = [(position[node], node) for node, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for user in node.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (position[user], user))
    if len(order) != len(position):
        raise RuntimeError(
            f"the partitioned graph has a cycle through {[n for n, c in waiting.items() if c]}"
        )
    anchor = graph._root  # the list's sentinel: each node in turn moves right after the one before it
    for node in order:
        if anchor._next is not node:
            anchor.append(node)
        anchor = node


@register_patch("executorch.internals", "executorch.exir.backend.backend_api.create_submodule_from_nodes")
def _patch_partition_without_regenerating_the_graph(original: Any) -> Any:
    """Fuses each partition without rebuilding the graph (``skip_legalize_graph=True``), then sorts it in place.

    **Why**: ``create_submodule_from_nodes`` copies the whole graph and regenerates its code once per partition: the
    Qwen2-0.5B-shaped decoder (123 partitions, ~4,000 nodes) spent 34 s there.
    **Upstream**: the TODO T153794167 in ``exir/lowered_backend_module.py`` (move to ``fuse_by_partitions``).
    **Remove when**: ``to_backend`` fuses all partitions before one legalization (``fuse_by_partitions``).
    """

    @functools.wraps(original)
    def create_submodule_from_nodes(
        gm: torch.fx.GraphModule, node_list: Any, tag: str, skip_legalize_graph: bool = False
    ) -> Any:
        submodule, call = original(gm, node_list, tag, skip_legalize_graph=True)
        if not skip_legalize_graph:
            _sort_in_place(gm.graph)
        return submodule, call

    return create_submodule_from_nodes


class _TensorsShared:
    """``copy`` for ``duplicate_constant_node_pass``: ``deepcopy`` returns a tensor itself, and copies the rest."""

    @staticmethod
    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        return value if isinstance(value, torch.Tensor) else copy.deepcopy(value, memo)


@register_patch("executorch.internals", "executorch.exir.backend.utils.duplicate_constant_node")
def _patch_duplicated_constant_shares_its_tensor(original: Any) -> Any:
    """A weight that a partition and a node outside it both read (a tied LM head and its embedding) is given to each
    side as one tensor, not deep-copied for the partition.

    **Why**: ``to_backend`` gives the partition its own placeholder for such a weight and ``copy.deepcopy``-s the
    tensor into the program's state dict, where the lowered module keeps it until the program is written: the
    Qwen2-0.5B-shaped decoder's 545 MB table held twice from ``to_backend`` to the runtime's load. Lowering never
    writes a weight; the serializers read each side's bytes (stored once, by their hash).
    **Upstream**: none found (``exir/backend/canonical_partitioners/duplicate_constant_node_pass.py``).
    **Remove when**: the pass shares the tensor (the test sees a copy with the patch disabled).
    """
    from executorch.exir.backend.canonical_partitioners import duplicate_constant_node_pass as module

    @functools.wraps(original)
    def duplicate_constant_node(*args: Any, **kwargs: Any) -> Any:
        saved, module.copy = module.copy, _TensorsShared
        try:
            return original(*args, **kwargs)
        finally:
            module.copy = saved

    return duplicate_constant_node
