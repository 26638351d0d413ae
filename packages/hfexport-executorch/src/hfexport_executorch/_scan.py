"""Programs ExecuTorch's ``scan`` loop cannot run: checked before lowering. Nothing here imports executorch."""

from __future__ import annotations

import torch

__all__ = ["check_scan_dynamic_dims"]


def check_scan_dynamic_dims(program: torch.export.ExportedProgram) -> None:
    """Refuse, before lowering, a ``scan`` whose carry or per-step outputs have a dynamic size.

    ExecuTorch (1.5.1) emits ``torch.ops.higher_order.scan`` as a loop over buffers planned at their upper bounds
    and never resizes them along any dim but the scanned one: the carry is filled with ``aten::copy_`` (which
    does not resize) and the stacked outputs with ``executorch_prim::et_copy_index`` (which checks every dim but
    the first against the buffer). Such a program lowers, then fails at run time even at the traced shape
    (``op_copy.cpp: Check failed (tensor_is_broadcastable_to(src, in))``, ``0x12``): Mamba's selective scan
    (``hfexport_dynamo._recurrences``) with a dynamic batch. A dynamic scanned length (Mamba's sequence) runs.

    Raises:
        ValueError: naming the inputs' dims whose sizes reach the scan, and what to export instead.
    """
    from torch.fx.experimental.symbolic_shapes import free_symbols

    where: dict[str, str] = {}  # symbol -> "input dim"
    for node in program.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        for dim, size in enumerate(getattr(value, "shape", ())):
            if isinstance(size, torch.SymInt) and size.node.expr.is_symbol:
                where.setdefault(str(size.node.expr), f"{node.name!r} dim {dim}")
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.higher_order.scan:
            continue
        init = node.args[1]
        values = node.meta.get("val") or ()
        carries, stacked = list(values[:len(init)]), list(values[len(init):])
        shapes = [tuple(v.shape) for v in carries if isinstance(v, torch.Tensor)] + \
            [tuple(v.shape)[1:] for v in stacked if isinstance(v, torch.Tensor)]
        symbols = sorted({str(s) for shape in shapes for size in shape for s in free_symbols(size)})
        if symbols:
            named = ", ".join(where.get(s, s) for s in symbols)
            raise ValueError(
                f"a scan loop ({node.name}: a recurrence such as Mamba's selective scan) carries a dynamic size "
                f"({', '.join(symbols)}: {named}), which ExecuTorch's scan loop cannot resize: its carry and step "
                "outputs stay at their planned size and the program fails at run time (executorch 1.5.1 "
                "exir/emit/_emitter.py _emit_scan; only the scanned length may vary). Keep those dims static, e.g. "
                "dynamic_shapes={'input_ids': {1: Dim('seq')}, 'attention_mask': {1: Dim('seq')}} (a dynamic "
                "sequence, a fixed batch), or export with dynamic=False")
