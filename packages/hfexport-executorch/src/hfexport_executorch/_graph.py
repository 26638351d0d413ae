"""FX graph helpers of the ExecuTorch fixes: symbolic values of nodes, emitting Python sym ops, shape envs."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["GRAPH_ASSERTS", "emit", "is_symint_arg", "replace_with_chain", "shape_envs", "value"]

# The graph assertions ExecuTorch's RemoveGraphAssertsPass deletes before emission (exir/passes/
# remove_graph_asserts_pass.py): the runtime checks none of them.
GRAPH_ASSERTS = frozenset({
    torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_async.msg,
    torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten.sym_constrain_range.default,
})


def shape_envs(program: torch.export.ExportedProgram) -> list[Any]:
    """Every ShapeEnv that the symbolic sizes in the nodes' ``meta["val"]`` point to."""
    envs: dict[int, Any] = {}
    for node in program.graph.nodes:
        for val in pytree.tree_leaves(node.meta.get("val")):
            symbols: list[Any] = []
            if isinstance(val, torch.Tensor):
                symbols = [s for s in (*val.shape, *val.stride()) if isinstance(s, torch.SymInt)]
            elif isinstance(val, torch.SymInt):
                symbols = [val]
            for s in symbols:
                envs.setdefault(id(s.node.shape_env), s.node.shape_env)
    return list(envs.values())


def value(arg: Any) -> Any:
    """The value an FX argument stands for: a node's ``meta["val"]``, or the argument itself."""
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def emit(gm: torch.fx.GraphModule, like: torch.fx.Node, fn: Any, *args: Any) -> torch.fx.Node:
    """A ``call_function`` node ``fn(*args)`` with ``like``'s metadata and a computed ``meta["val"]``."""
    new = gm.graph.call_function(fn, args)
    new.meta = {k: v for k, v in like.meta.items() if k != "val"}
    values = [value(a) for a in args]
    if all(v is not None for v in values):
        new.meta["val"] = fn(*values)
    return new


def replace_with_chain(gm: torch.fx.GraphModule, node: torch.fx.Node, fn: Any, operands: list[Any]) -> None:
    """Fold ``operands`` with the binary Python op ``fn`` before ``node``; replace ``node`` with the result."""
    with gm.graph.inserting_before(node):
        acc = operands[0]
        for rhs in operands[1:]:
            acc = emit(gm, node, fn, acc, rhs)
    node.replace_all_uses_with(acc)
    gm.graph.erase_node(node)


def is_symint_arg(arg: Any) -> bool:
    """Whether ``arg`` is an int or a SymInt (not a bool)."""
    return isinstance(value(arg), int | torch.SymInt) and not isinstance(value(arg), bool)


def refuse_while_loop(program: torch.export.ExportedProgram, backend: str) -> None:
    """Raise when ``program`` (or a subgraph of it) holds a ``while_loop``, which ExecuTorch's emitter rejects only
    after the whole lowering (``Unsupported control flow operator: while_loop``).

    Raises:
        ValueError: naming the op, ExecuTorch's upstream issue and the option that traces the loop bounded.
    """
    modules = [program.graph_module, *(m for _, m in program.graph_module.named_modules()
                                       if isinstance(m, torch.fx.GraphModule))]
    if any(n.op == "call_function" and n.target is torch.ops.higher_order.while_loop
           for m in modules for n in m.graph.nodes):
        raise ValueError(
            f"{backend} cannot run torch.ops.higher_order.while_loop: ExecuTorch's emitter has no while_loop "
            "(pytorch/executorch#8769, open), and a data-dependent trip count cannot be unrolled without a bound. "
            "Pass while_loop_max_iterations=N (at least the largest trip count: a loop that would run longer stops "
            "at N) to trace each while_loop as N masked iterations, or export with backend='onnx' or 'openvino', "
            "which run the loop as it is")
