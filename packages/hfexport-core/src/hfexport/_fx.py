"""Apply registered FX node fixes and FX program fixes."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._registry import Registration

if TYPE_CHECKING:
    import torch

__all__ = ["FixReport", "apply_fx_node_fixes", "apply_fx_program_fixes", "iter_graph_modules"]

logger = logging.getLogger("hfexport")

# torch.export's pre-dispatch IR records vmap (and jvp) as calls that enter and leave a functorch level
# (pytorch/pytorch#154650); they have no users, and FX's dead-code elimination does not count them as side
# effects (not in torch.fx.node._side_effectful_functions). Removing them leaves ``_add_batch_dim`` outside any
# vmap level, and the next re-trace fails ("your tensor may have escaped from inside a function being vmapped":
# transformers' vmapped attention masks, Gemma3 on ExecuTorch). No upstream issue found.
_FUNCTORCH_LEVEL_CALLS_MODULE = "torch._functorch.predispatch"


def _is_impure(node: torch.fx.Node) -> bool:
    """FX's own test, plus the pre-dispatch functorch level calls, which must survive dead-code elimination."""
    return node.is_impure() or (node.op == "call_function"
                                and getattr(node.target, "__module__", None) == _FUNCTORCH_LEVEL_CALLS_MODULE)


@dataclass
class FixReport:
    """How often each fix fired (fix qualified name -> count of nodes or programs it rewrote)."""

    applied: dict[str, int] = field(default_factory=dict)

    def count(self, registration: Registration, n: int = 1) -> None:
        self.applied[registration.qualified_name] = self.applied.get(registration.qualified_name, 0) + n

    @property
    def changed(self) -> bool:
        return bool(self.applied)


def iter_graph_modules(root: torch.nn.Module) -> list[torch.fx.GraphModule]:
    """``root`` and every GraphModule below it (the bodies of ``cond``, ``map``, ``while_loop`` ...)."""
    import torch.fx

    return [m for m in root.modules() if isinstance(m, torch.fx.GraphModule)]


def _call(fix: Registration, ctx: Any, *args: Any) -> Any:
    return fix.func(*args, ctx=ctx) if fix.takes_context else fix.func(*args)


def apply_fx_node_fixes(gm: torch.fx.GraphModule, fixes: Iterable[Registration],
                        report: FixReport | None = None, ctx: Any = None) -> FixReport:
    """Run each fix on every node of ``gm`` and its sub-GraphModules, then eliminate dead code.

    A fix returning ``True`` consumed the node: later fixes do not see it. Each graph that changed is
    linted and recompiled.

    Args:
        gm: a GraphModule (``exported_program.graph_module`` or any FX graph).
        fixes: registrations of kind ``fx_node_fix``.
        report: a report to add to; a new one when omitted.
        ctx: the export's ``ExportContext``, passed as ``ctx=`` to fixes that declare a ``ctx`` parameter.

    Returns:
        The report: which fix fired how often.
    """
    report = report or FixReport()
    fixes = list(fixes)
    if not fixes:
        return report
    before = dict(report.applied)
    for module in iter_graph_modules(gm):
        changed = False
        for node in list(module.graph.nodes):
            if getattr(node, "_erased", False):  # erased by an earlier fix (FX keeps node.graph after erase_node)
                continue
            for fix in fixes:
                if _call(fix, ctx, module, node):
                    report.count(fix)
                    changed = True
                    break
        if changed:
            try:
                module.graph.eliminate_dead_code(is_impure_node=_is_impure)
            except Exception as exc:  # never fatal: the graph is valid, only larger; but never silent
                logger.warning("dead-code elimination failed on %s: %s", type(module).__name__, exc)
            module.graph.lint()
            module.recompile()
    for name, count in report.applied.items():
        if count != before.get(name, 0):
            logger.info("FX node fix %s applied to %d node(s)", name, count - before.get(name, 0))
    return report


def apply_fx_program_fixes(exported_program: Any, fixes: Iterable[Registration],
                           report: FixReport | None = None, ctx: Any = None) -> FixReport:
    """Run each program fix on ``exported_program`` (in place), in registration order.

    A fix may return ``False`` to say it did not apply; anything else counts as applied. Fixes that declare
    a ``ctx`` parameter get the export's ``ExportContext``.
    """
    report = report or FixReport()
    for fix in fixes:
        if _call(fix, ctx, exported_program) is not False:
            report.count(fix)
            logger.info("FX program fix %s applied", fix.qualified_name)
    return report

