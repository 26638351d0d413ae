"""The graph ``openvino.convert_model`` reads: the lifted graph of an ``ExportedProgram`` with its weights as
constants and its mutable buffers as inputs and outputs, so that stage 5 can make each buffer an OpenVINO variable.

``ExportedProgram.module()`` (what ``openvino.convert_model`` decodes) writes a mutated buffer back with
``copy_`` into the module's attribute, which OpenVINO's frontend converts as a value that no output reads: the
mutation is lost (a KV cache kept in buffers would be zeros at every call). Here each mutated buffer stays a
graph input (its value before the call) and its new value stays a graph output; every parameter, other buffer
and constant becomes a ``get_attr`` of the graph module, which OpenVINO stores once as a constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["INPUT_MUTATION", "ProgramState", "call_with_meta", "constants_inlined", "make_growing_stateful",
           "make_stateful", "model_io_names", "scan_as_while_loop"]

STATE_INPUT = "state_in."  # the OpenVINO input name of a mutable buffer's value before a call (then a variable)
STATE_OUTPUT = "state_out."  # the output name of its value after the call
INPUT_MUTATION = "input_mutation."  # + an input leaf's name: the new value of an input the program mutates in place


@dataclass
class ProgramState:
    """A mutable buffer of the program, which stage 5 makes an OpenVINO variable.

    Attributes:
        buffer: its fully qualified name in the model (``cache_keys_0``).
        shape: its shape (static).
        dtype: its torch dtype.
        initial: its initial value, the variable's initializer; ``None`` for zeros (stored as a broadcast scalar).
    """

    buffer: str
    shape: list[int]
    dtype: Any
    initial: Any = None

    @property
    def input_name(self) -> str:
        return STATE_INPUT + self.buffer

    @property
    def output_name(self) -> str:
        return STATE_OUTPUT + self.buffer


def constants_inlined(program: Any) -> tuple[Any, list[ProgramState]]:
    """The graph module of ``program`` (changed in place: pass a program of one's own, as the decomposed one) with
    parameters, non-mutated buffers and constants as ``get_attr`` nodes, and the mutable buffers it writes.

    The module's placeholders are then the mutated buffers (in the signature's order) followed by the user inputs;
    its outputs are the buffers' new values, the new values of the user inputs it mutates in place (named
    ``input_mutation.<input leaf>`` by :func:`model_io_names`; the runner copies them into the caller's tensors, as
    eager ``forward`` changes them), then the user outputs (the signature's order).

    Raises:
        NotImplementedError: a constant is not a tensor.
    """
    import torch

    signature = program.graph_signature
    gm = program.graph_module
    graph = gm.graph
    mutated = dict(signature.buffers_to_mutate)  # output name -> buffer
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    states: list[ProgramState] = []
    mutated_buffers = set(mutated.values())
    for index, spec in enumerate(signature.input_specs):
        kind = spec.kind.name
        if kind == "USER_INPUT" and type(spec.arg).__name__ == "ConstantArgument":
            node = placeholders[spec.arg.name]  # a None leaf (a cache's unused state slot, {0: t, 1: None}):
            if not node.users:                   # the decoder made it a model input that no leaf name matches
                graph.erase_node(node)
            continue
        if kind in ("USER_INPUT", "TOKEN"):
            continue
        node = placeholders[spec.arg.name]
        if kind == "BUFFER" and spec.target in mutated_buffers:
            value = program.state_dict.get(spec.target, program.constants.get(spec.target))
            zero = value.numel() == 0 or not bool(value.any())
            states.append(ProgramState(spec.target, list(value.shape), value.dtype, None if zero else value))
            continue
        value = program.state_dict[spec.target] if spec.target in program.state_dict else program.constants[spec.target]
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"the program's constant {spec.target!r} is a {type(value).__name__}, not a "
                                      "tensor; OpenVINO's frontend converts tensors only")
        attr = f"_ov_constant_{index}"
        gm.register_buffer(attr, value.detach(), persistent=False)
        with graph.inserting_before(node):
            constant = graph.get_attr(attr)
        constant.meta = dict(node.meta)
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
    symint_outputs_as_tensors(gm)
    distinct_outputs(gm)
    gm.recompile()
    return gm, states


def symint_outputs_as_tensors(gm: Any) -> None:
    """Return each output of ``gm`` that is a SymInt (an int computed from dynamic dims) as a 0-d int64 tensor
    (``aten.scalar_tensor``): OpenVINO's FX decoder takes an output node for a tensor and failed on such one with
    ``Tensor name is not a number: floordiv`` (MaskFormer-Swin's spatial sizes, T5Gemma's). The runner gives them
    back as ints (``io["int_outputs"]``). Part of preparing the graph for the decoder, after the program's signature
    has named its outputs (so not an FX node fix, which runs before). Upstream: none found (OpenVINO's
    ``translate_session.cpp``); remove when ``test_an_int_output_from_a_dynamic_dim_comes_back_as_an_int`` passes
    without it."""
    import torch
    import torch.utils._pytree as pytree

    graph = gm.graph
    output = next(node for node in graph.nodes if node.op == "output")
    fake_mode = graph_fake_mode(graph)

    def as_tensor(arg: Any) -> Any:
        if not isinstance(arg, torch.fx.Node) or not isinstance(arg.meta.get("val"), torch.SymInt):
            return arg
        with graph.inserting_before(output):
            return call_with_meta(graph, torch.ops.aten.scalar_tensor.default, (arg,), {"dtype": torch.int64},
                                  fake_mode)

    output.args = pytree.tree_map(as_tensor, output.args)


def graph_fake_mode(graph: Any) -> Any:
    """The fake mode of ``graph``'s traced values (``meta["val"]``), to compute a new node's; None if it has none."""
    return next((n.meta["val"].fake_mode for n in graph.nodes if hasattr(n.meta.get("val"), "fake_mode")), None)


def call_with_meta(graph: Any, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                   fake_mode: Any = None) -> Any:
    """A new ``call_function`` node of ``op`` in ``graph`` (at its insertion point), its ``meta["val"]`` computed on
    the fake values of its inputs (nested ones included) in ``fake_mode``, else the graph's; none when neither has
    one."""
    import torch
    import torch.utils._pytree as pytree

    kwargs = kwargs or {}
    created = graph.call_function(op, args, kwargs)
    fake_mode = fake_mode or graph_fake_mode(graph)
    if fake_mode is not None:
        with fake_mode:
            created.meta["val"] = op(*pytree.tree_map(lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a,
                                                      list(args)), **kwargs)
    return created


def model_io_names(program: Any, states: list[ProgramState], io: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The names of the converted model's inputs and outputs, in the order of :func:`constants_inlined`'s graph:
    the mutable buffers' (``state_in.<buffer>`` / ``state_out.<buffer>``), the mutated user inputs'
    (``input_mutation.<input leaf>``) and the tensor leaves of ``io``."""
    from torch.export.graph_signature import SymIntArgument, TensorArgument

    named_inputs = [name for name in io["input_leaves"] if name is not None]
    inputs = [state.input_name for state in states] + named_inputs
    user_inputs = [spec.arg.name for spec in program.graph_signature.input_specs
                   if spec.kind.name == "USER_INPUT" and type(spec.arg).__name__ != "ConstantArgument"]
    user = iter(name for name in io["output_leaves"] if name is not None)
    outputs = []
    for spec in program.graph_signature.output_specs:
        if spec.kind.name == "BUFFER_MUTATION":
            outputs.append(STATE_OUTPUT + spec.target)
        elif spec.kind.name == "USER_INPUT_MUTATION":  # the user inputs are the named leaves, in order
            outputs.append(INPUT_MUTATION + named_inputs[user_inputs.index(spec.target)])
        elif spec.kind.name == "USER_OUTPUT" and isinstance(spec.arg, TensorArgument | SymIntArgument):
            outputs.append(next(user))
    return inputs, outputs


def make_stateful(model: Any, states: list[ProgramState]) -> dict[str, str]:
    """Make each mutable buffer's input and output of ``model`` (an ``openvino.Model``, changed in place) one
    OpenVINO variable, as ``openvino.passes.MakeStateful`` does (the input becomes a ``ReadValue``, the output an
    ``Assign``), with the buffer's static shape in the variable's info: such a variable starts from zeros on the CPU
    plugin (nothing stored, no initializer computed at each call); a buffer that starts from other values gets them
    as the ``ReadValue``'s constant initializer. The CPU plugin keeps each variable in the infer request from one call
    to the next; ``reset_state()`` returns it to its initial value.

    ``MakeStateful`` itself gives the variable the parameter's shape as converted, which the CPU plugin read as an
    empty tensor (``reshape: the shape of input data (0.0.0) conflicts with the reshape pattern (4.32.8)`` at the first
    call of a generation program). A zeros initializer as a ``Broadcast`` was computed at every call (3.7 of 65 ms of a
    decode step over a 2,048-position cache, in the CPU plugin's performance counters).

    Returns:
        ``{variable id: buffer name}``.
    """
    import openvino
    import openvino.opset13 as ops
    from openvino.op.util import Variable, VariableInfo

    inputs = [port.get_names() for port in model.inputs]
    outputs = [port.get_names() for port in model.outputs]
    parameters, results = model.get_parameters(), model.get_results()
    made: dict[str, str] = {}
    for state in states:
        found = [i for i, names in enumerate(inputs) if state.input_name in names]
        result = results[next(i for i, names in enumerate(outputs) if state.output_name in names)]
        if not found:  # the program writes the buffer and never reads its old value (a rotary inv_freq set by
            model.remove_result(result)  # copy_ at each call): the decoder dropped its input, and its value
            continue  # between calls reaches no output, so no variable keeps it
        parameter = parameters[found[0]]
        element_type = parameter.get_output_element_type(0)
        info = VariableInfo()
        info.variable_id, info.data_type = state.buffer, element_type
        info.data_shape = openvino.PartialShape(state.shape)
        variable = Variable(info)
        if state.initial is None:  # a variable of a static shape starts from zeros on the CPU plugin
            read = ops.read_value(variable)
        else:
            read = ops.read_value(ops.constant(state.initial.detach().cpu().numpy()), variable)
        parameter.output(0).replace(read.output(0))
        value = result.input_value(0)
        assign = ops.assign(value.get_node(), variable)  # takes a node: its output 0, set right below
        assign.input(0).replace_source_output(value)
        model.add_sinks([assign])
        model.remove_result(result)
        model.remove_parameter(parameter)
        model.add_variables([variable])
        made[state.buffer] = state.buffer
    model.validate_nodes_and_infer_types()
    return made


def make_growing_stateful(model: Any, pairs: list[tuple[str, str]], shapes: list[list[int | None]],
                          tokens: str = "input_ids") -> dict[str, dict[str, str]]:
    """Make each ``(input, output)`` pair of ``model`` (an ``openvino.Model``, changed in place) a cache that grows:
    one OpenVINO variable, as OpenVINO GenAI and the CPU plugin expect of a stateful LLM (the layout
    optimum-intel's export has). The input ``[batch, kv_heads, past, head_dim]`` becomes a ``ReadValue`` that
    starts empty (``past = 0``), reordered along the batch by a new input ``beam_idx`` ``int32 [batch]`` (a
    ``Gather``; ``arange(batch)`` keeps the rows), and the output (the input with the new positions concatenated)
    its ``Assign`` (``openvino._offline_transformations.apply_make_stateful_transformation``). Where the concat feeds
    a ``ScaledDotProductAttention``, the CPU plugin fuses the three into its own cache, appended to in place and
    read only over the positions held.

    Args:
        pairs: the input and output names of each cache tensor (``past_key_values.<i>.key``, ``present.<i>.key``).
        shapes: per pair, the dims after the batch, None for the one that grows: ``[kv_heads, None, head_dim]``;
            all static for a linear-attention layer's state (``[channels, kernel]``), which starts as zeros.
        tokens: the input whose dim 0 is the batch.

    Returns:
        ``{variable id: {"input": name, "output": name}}``.
    """
    import numpy as np
    import openvino
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    batch_dim = model.input(tokens).get_partial_shape()[0]
    for (name, _), dims in zip(pairs, shapes, strict=True):
        model.input(name).get_node().set_partial_shape(openvino.PartialShape(
            [batch_dim, *(openvino.Dimension() if d is None else openvino.Dimension(d) for d in dims)]))
    beam_idx = ops.parameter(openvino.PartialShape([batch_dim]), openvino.Type.i32, name="beam_idx")
    beam_idx.output(0).get_tensor().set_names({"beam_idx"})
    model.add_parameters([beam_idx])
    for name, _ in pairs:
        port = model.input(name)
        consumers = list(port.get_target_inputs())
        reordered = ops.gather(port, beam_idx, ops.constant(np.int64(0)))
        for consumer in consumers:
            consumer.replace_source_output(reordered.output(0))
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, dict(pairs))
    batch = ops.gather(ops.shape_of(model.input(tokens), output_type="i64"), ops.constant(np.array([0], np.int64)),
                       ops.constant(np.int64(0)))
    for op in model.get_ops():  # each variable starts as [batch, kv_heads, 0, head_dim] zeros (a state: all dims)
        if op.get_type_name() == "ReadValue":
            dims = list(op.get_output_partial_shape(0))[1:]
            shape = ops.concat([batch, ops.constant(np.array([0 if d.is_dynamic else d.get_length() for d in dims],
                                                             np.int64))], 0)
            # a zero of the variable's own type (bf16 has no numpy dtype: to_dtype() gave f16, which ReadValue
            # refused for a bf16 cache: "The type specified in the Variable has to extend ... Initialization type")
            op.set_arguments([ops.broadcast(ops.constant(0.0, dtype=op.get_output_element_type(0)), shape)])
    model.validate_nodes_and_infer_types()
    ids = {variable.get_info().variable_id for variable in model.get_variables()}
    # MakeStateful names a variable by its input's name and its output's, joined
    return {name + output: {"input": name, "output": output} for name, output in pairs if name + output in ids}


def distinct_outputs(gm: Any) -> None:
    """Give each repeat of a node among ``gm``'s outputs, and each input returned as an output, its own node,
    ``x * 1`` (``x | x`` for booleans). OpenVINO's FX decoder failed on a node returned twice with ``Tensor name is
    not a number: mul`` (T5Gemma returns its encoder's last hidden state as two outputs, VipLLaVA an image feature
    twice); an ``aten.clone`` converts to nothing and failed the same way. An input returned as it is shares its
    tensor with the output, so naming the output renamed the input (Qwen2-Audio returns its ``attention_mask``:
    the compiled model's input was ``attention_mask_1``). Upstream: none found (``translate_session.cpp``); remove
    when ``test_a_tensor_returned_twice_comes_back_twice`` and ``test_an_input_returned_keeps_its_name`` pass
    without it."""
    import torch
    import torch.utils._pytree as pytree

    graph = gm.graph
    output = next(node for node in graph.nodes if node.op == "output")
    seen: set[Any] = set()

    def distinct(arg: Any) -> Any:
        if not isinstance(arg, torch.fx.Node):
            return arg
        if arg not in seen and arg.op != "placeholder":
            seen.add(arg)
            return arg
        with graph.inserting_before(output):
            val = arg.meta.get("val")
            copy = graph.call_function(torch.ops.aten.logical_or.default, (arg, arg)) \
                if getattr(val, "dtype", None) == torch.bool else graph.call_function(torch.ops.aten.mul.Tensor, (arg, 1))
        copy.meta = dict(arg.meta)
        return copy

    output.args = pytree.tree_map(distinct, output.args)


def scan_as_while_loop(gm: Any, node: Any) -> bool:
    """Rewrite the ``torch.ops.higher_order.scan`` call ``node`` of ``gm`` (in place) as a
    ``torch.ops.higher_order.while_loop`` over the scanned dim, with every operand carried.

    ``scan(combine, init, xs, additional)`` returns ``(final_carry..., stacked_ys...)``. The loop carries
    ``(index, ys_buffers..., carry..., xs..., additional...)``: the body (``combine``'s own graph module, extended
    in place, so the fixes that run after this one still visit it) takes step ``index`` of each ``xs`` with
    ``index_select``, runs ``combine``'s ops, writes each ``y`` into its ``[length, *y.shape]`` buffer with
    ``index_copy``, and returns ``xs`` and ``additional`` unchanged; the condition is ``index < xs[0].shape[0]``.
    The same arithmetic in the same order: the outputs are equal.

    Returns:
        False, leaving the graph as it was, when the call has keyword arguments, its combine graph is shared with
        another call, or a buffer's size is a symbol that no operand's shape holds; True once rewritten.
    """
    import torch

    aten = torch.ops.aten
    combine_attr, init, xs, additional = node.args
    combine = getattr(gm, combine_attr.target, None) if combine_attr.op == "get_attr" else None
    fake_mode = graph_fake_mode(gm.graph)
    if node.kwargs or combine is None or not xs or fake_mode is None or "val" not in node.meta:
        return False
    operands = [*init, *xs, *additional]
    operand_vals = [o.meta["val"] if isinstance(o, torch.fx.Node) else o for o in operands]
    carry_vals, ys_vals = list(node.meta["val"][:len(init)]), list(node.meta["val"][len(init):])
    graph = gm.graph
    sizes = [_size_sources(y.shape, operands, operand_vals) for y in ys_vals]
    if any(size is None for size in sizes):
        return False
    old_inputs = [n for n in combine.graph.nodes if n.op == "placeholder"]
    shared = [n for n in graph.nodes if n.op == "get_attr" and n.target == combine_attr.target]
    if len(old_inputs) != len(operands) or len(shared) > 1 or len(combine_attr.users) > 1:
        return False  # the combine graph is extended in place: it must be this scan's alone

    def call(g: Any, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
        return call_with_meta(g, op, args, kwargs, fake_mode)  # the loop's graphs share the program's fake mode

    with fake_mode:
        index_val = torch.zeros((), dtype=torch.int64)
    loop_vals = [index_val, *ys_vals, *operand_vals]
    names = ["index", *(f"ys_{j}" for j in range(len(ys_vals))), *(f"carry_{j}" for j in range(len(init))),
             *(f"xs_{j}" for j in range(len(xs))), *(f"additional_{j}" for j in range(len(additional)))]

    def loop_inputs(g: Any) -> list[Any]:
        made = []
        for name, val in zip(names, loop_vals, strict=True):
            made.append(g.placeholder(name))
            made[-1].meta["val"] = val
        return made

    # The condition: index < length of the scanned dim.
    cond_graph = torch.fx.Graph()
    cond_inputs = loop_inputs(cond_graph)
    length = call(cond_graph, aten.sym_size.int, (cond_inputs[1 + len(ys_vals) + len(init)], 0))
    cond_graph.output(call(cond_graph, aten.lt.Scalar, (cond_inputs[0], length)))
    cond_name = _free_attr(gm, "while_loop_cond_graph")
    gm.register_module(cond_name, torch.fx.GraphModule(torch.nn.Module(), cond_graph))

    # The body: combine's graph, its inputs taken from the carried operands, its ys written at the index.
    body = combine.graph
    with body.inserting_before(old_inputs[0]):
        inputs = loop_inputs(body)
    index, buffers = inputs[0], inputs[1:1 + len(ys_vals)]
    carried = inputs[1 + len(ys_vals):]
    with body.inserting_before(old_inputs[-1].next):
        at = call(body, aten.view.default, (index, [1]))
        steps = {}
        for k in range(len(xs)):
            picked = call(body, aten.index_select.default, (carried[len(init) + k], 0, at))
            steps[k] = call(body, aten.squeeze.dim, (picked, 0))
    for j, old in enumerate(old_inputs):
        is_step = len(init) <= j < len(init) + len(xs)
        old.replace_all_uses_with(steps[j - len(init)] if is_step else carried[j])
        body.erase_node(old)
    output = next(n for n in body.nodes if n.op == "output")
    results = list(output.args[0])
    with body.inserting_before(output):
        written = [call(body, aten.index_copy.default, (buffer, 0, at, call(body, aten.unsqueeze.default, (y, 0))))
                   for buffer, y in zip(buffers, results[len(init):], strict=True)]
        following = call(body, aten.add.Tensor, (index, 1))
    output.args = ((following, *written, *results[:len(init)], *carried[len(init):]),)
    combine.recompile()

    # The loop, in place of the scan.
    with graph.inserting_before(node):
        start = call(graph, aten.zeros.default, ([],), {"dtype": torch.int64})
        ys_buffers = []
        for size, y in zip(sizes, ys_vals, strict=True):
            shape = [s if isinstance(s, int) else call(graph, aten.sym_size.int, s) for s in size]
            ys_buffers.append(call(graph, aten.zeros.default, (shape,), {"dtype": y.dtype}))
        cond_attr = graph.get_attr(cond_name)
        loop = graph.call_function(torch.ops.higher_order.while_loop,
                                   (cond_attr, combine_attr, (start, *ys_buffers, *operands), ()))
    loop.meta["val"] = (index_val, *ys_vals, *carry_vals, *operand_vals[len(init):])
    for user in list(node.users):
        j = user.args[1]
        user.args = (loop, 1 + len(ys_vals) + j if j < len(init) else 1 + j - len(init))
    graph.erase_node(node)
    return True


def _size_sources(shape: Any, operands: list[Any], vals: list[Any]) -> list[Any] | None:
    """``shape`` with each symbolic size as ``(operand, dim)``, an operand whose dim ``dim`` has that size (an int
    stays an int); None when no operand has one."""
    import torch

    sources: list[Any] = []
    for size in shape:
        if isinstance(size, int):
            sources.append(size)
            continue
        found = next(((operand, dim) for operand, val in zip(operands, vals, strict=True)
                      if isinstance(val, torch.Tensor)
                      for dim, other in enumerate(val.shape)
                      if isinstance(other, torch.SymInt) and other.node.expr == size.node.expr), None)
        if found is None:
            return None
        sources.append(found)
    return sources


def _free_attr(gm: Any, prefix: str) -> str:
    """The first ``<prefix>_<n>`` that is not an attribute of ``gm``."""
    n = 0
    while hasattr(gm, f"{prefix}_{n}"):
        n += 1
    return f"{prefix}_{n}"
