"""Which delegated partition makes a program differ from eager: the diagnosis of a failed ExecuTorch verification.

The export's program is lowered again with some partitions left on portable kernels (a partitioner wrapper drops
their delegation tags), run on the traced inputs and compared with eager:

1. nothing delegated: if the program still differs, the fault is not in a delegate (said so, and stop);
2. bisection over the partitions, delegating half of the candidates each time: the partition that alone makes
   the program differ, in about log2(partitions) lowerings;
3. for a partitioner built from per-op configs (XNNPACK's), the ops of that partition refused one at a time (the
   most frequent first, at most 8): the first whose exclusion alone makes the program match.

Each lowering costs about what the export's did; the search stops when its time budget (three lowerings, at least
30 s) is spent and says how far it got. executorch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from hfexport.artifact import compare_outputs
from hfexport.plugin import ExportContext, ExportedModel
from hfexport.workarounds import patch_context

__all__ = ["bisect_delegates"]

logger = logging.getLogger("hfexport")
MAX_OP_TRIALS = 8


def _op_key(node: torch.fx.Node) -> str | None:
    """The name a config-based partitioner keys its per-op configs by (``mm.default``)."""
    from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

    name = getattr(node.target, "__name__", None)
    return format_target_name(name) if node.op == "call_function" and name else None


def _filtered(inner: Any, index: int, keep: set[str] | None, seen: dict[str, Counter], record: bool) -> Any:
    """A partitioner that partitions as ``inner`` and then delegates only the partitions named in ``keep``
    (``"<index>:<tag>"``; None: all); with ``record``, every partition it saw goes into ``seen`` with its op
    counts."""
    from executorch.exir.backend.partitioner import Partitioner, PartitionResult

    class Filtered(Partitioner):
        def __init__(self) -> None:
            super().__init__()
            self.delegation_spec = getattr(inner, "delegation_spec", None)

        def ops_to_not_decompose(self, ep: Any) -> Any:
            return inner.ops_to_not_decompose(ep)

        def partition(self, exported_program: Any) -> Any:
            result = inner.partition(exported_program)
            kept = {}
            for node in result.tagged_exported_program.graph_module.graph.nodes:
                tag = node.meta.get("delegation_tag")
                if tag is None:
                    continue
                key = f"{index}:{tag}"
                key_op = _op_key(node)
                if record and key_op:
                    seen.setdefault(key, Counter())[key_op] += 1
                if keep is not None and key not in keep:
                    del node.meta["delegation_tag"]
            for tag, spec in result.partition_tags.items():
                if keep is None or f"{index}:{tag}" in keep:
                    kept[tag] = spec
            return PartitionResult(tagged_exported_program=result.tagged_exported_program, partition_tags=kept)

    return Filtered()


@contextlib.contextmanager
def _refusing(partitioners: list[Any], op: str) -> Iterator[None]:
    """Make every config-based partitioner refuse ``op`` (its per-op config's ``check_constraints``)."""
    undo = []
    for partitioner in partitioners:
        config = getattr(partitioner, "target_partitioner_configs", {}).get(op)
        if config is not None:
            undo.append((config, "check_constraints" in vars(config), vars(config).get("check_constraints")))
            config.check_constraints = lambda node, ep: False
    try:
        yield
    finally:
        for config, had, value in undo:
            if had:
                config.check_constraints = value
            else:
                del config.check_constraints


@contextlib.contextmanager
def _undelegated_ops_allowed() -> Iterator[None]:
    """Let ops a partitioner kept whole (``linear``) stay undelegated: the partitions left out run them on their
    portable kernels (``aten::linear.out``), and the delegation report's kernel check still refuses any without one.
    ``to_edge_transform_and_lower`` raises "was not decomposed or delegated" otherwise."""
    from executorch.exir.program import _program

    original = _program._sanity_check_graph_for_non_decomp_ops
    _program._sanity_check_graph_for_non_decomp_ops = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _program._sanity_check_graph_for_non_decomp_ops = original


def _natural(key: str) -> tuple[int, int, str]:
    index, _, tag = key.partition(":")
    digits = "".join(c for c in tag if c.isdigit())
    return int(index), int(digits) if digits else 0, tag


def bisect_delegates(ctx: ExportContext, exported: ExportedModel, inputs: Mapping[str, Any], report: Any,
                     partitioners: list[Any], lower: Callable[..., tuple[Any, Any, Any, Any]], *,
                     scopes: tuple[str, ...]) -> dict[str, Any]:
    """Find the delegated partition (and its op) that makes the program differ from eager.

    Args:
        ctx: the export's context (its program after the FX node fixes; its config's ``disable``).
        exported: the artifact whose verification failed; its default component's runner is swapped for each trial.
        inputs: the inputs the verification ran.
        report: that verification's report (its tolerances).
        partitioners: the variant's partitioners.
        lower: ``lower_program(ctx, partitioners)`` of the exporter.
        scopes: the patch scopes the export installed (installed again for each lowering).

    Returns:
        The diagnosis: ``partition`` (``"<partitioner index>:<tag>"``), ``partitioner``, ``partitions``, ``ops`` (op
        counts of that partition), ``culprit_ops`` (the op whose exclusion alone makes the program match; empty if none was found),
        ``lowerings``, ``complete`` (False when the time budget ran out), ``summary``.
    """
    from ._runner import ExecutorchRunner, input_dtypes, input_mutations

    component = exported.default_component
    original_runner = component.runner
    with torch.no_grad():
        expected = exported.reference(**copy.deepcopy(dict(inputs)))
    lowering_s = float(ctx.report["timings"].get("to_edge_transform_and_lower", 10.0) or 10.0)
    budget, start = max(30.0, 3 * lowering_s), time.perf_counter()
    seen: dict[str, Counter] = {}
    trials: list[dict[str, Any]] = []

    def matches(keep: set[str] | None, refuse: str | None = None) -> bool | None:
        """Whether the program lowered so matches eager; None: it could not be lowered or run."""
        wrapped = [_filtered(p, i, keep, seen, record=not trials) for i, p in enumerate(partitioners)]
        try:
            with patch_context(scopes, ctx.config.disable, ctx=ctx), _undelegated_ops_allowed(), (
                    _refusing(partitioners, refuse) if refuse else contextlib.nullcontext()):
                _, manager, _, _ = lower(ctx, wrapped)
        except Exception as exc:  # recorded in the trial; the search goes on where it can
            trials.append({"delegated": "all" if keep is None else sorted(keep, key=_natural),
                           "refused_op": refuse, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
            return None
        component.runner = ExecutorchRunner.from_program_manager(
            manager, input_dtypes=input_dtypes(ctx.inputs), input_mutations=input_mutations(manager.exported_program()))
        try:
            with torch.no_grad():
                actual = exported(**copy.deepcopy(dict(inputs)))
        finally:
            component.runner = original_runner
        result = compare_outputs(exported.backend, expected, actual, report.atol, report.rtol)
        trials.append({"delegated": "all" if keep is None else sorted(keep, key=_natural), "refused_op": refuse,
                       "passed": result.passed, "max_abs_diff": result.max_abs_diff})
        return result.passed

    def out_of_time() -> bool:
        return time.perf_counter() - start > budget

    names = [type(p).__name__ for p in partitioners]
    baseline = matches(set())
    if baseline is None:
        return {"partition": None, "lowerings": len(trials), "complete": False, "trials": trials,
                "summary": f"the program could not be lowered with nothing delegated ({trials[-1]['error']}), so no "
                           "partition could be singled out"}
    if not baseline:
        return {"partition": None, "lowerings": len(trials), "complete": True, "trials": trials,
                "summary": "the program differs from eager with nothing delegated too (portable kernels only): the "
                           "fault is not in a delegate"}
    candidates = sorted(seen, key=_natural)
    total = len(candidates)
    complete = True
    while len(candidates) > 1:
        if out_of_time():
            complete = False
            break
        half = candidates[:len(candidates) // 2]
        candidates = half if matches(set(half)) is False else candidates[len(candidates) // 2:]
    if len(candidates) != 1:
        return {"partition": None, "partitions": total, "lowerings": len(trials), "complete": False,
                "trials": trials, "summary": f"{total} delegated partitions; the time budget ({budget:.0f} s) ran out "
                                             f"before one was found ({len(candidates)} candidates left)"}
    culprit = candidates[0]
    index = int(culprit.split(":")[0])
    ops = seen.get(culprit, Counter())
    configs = getattr(partitioners[index], "target_partitioner_configs", {})
    culprit_ops = []
    for op, _ in ops.most_common():
        if op not in configs:
            continue
        if out_of_time() or len([t for t in trials if t["refused_op"]]) >= MAX_OP_TRIALS:
            complete = False
            break
        if matches(None, refuse=op) is True:
            culprit_ops.append(op)
            break  # one op that explains it; the others are not tried
    order = sorted(seen, key=_natural).index(culprit) + 1
    where = (f"{names[index]} partition {order} of {total} ({sum(ops.values())} nodes: "
             f"{', '.join(f'{op} x{n}' for op, n in ops.most_common(6))}{', ...' if len(ops) > 6 else ''})")
    if culprit_ops:
        cause = (f"with {' or '.join(culprit_ops)} refused by the partitioner (on portable kernels) the program "
                 "matches eager: exclude it with a partitioner check (hfexport_executorch/workarounds/"
                 "xnnpack_patches.py) and report it upstream")
    else:
        cause = ("with that partition on portable kernels the program matches eager" +
                 ("" if complete else "; the time budget ran out before its ops were tried") +
                 ("; refusing any one of its ops alone does not fix it" if complete and configs else ""))
    return {"partition": culprit, "partitioner": names[index], "partitions": total, "ops": dict(ops.most_common()),
            "culprit_ops": culprit_ops, "lowerings": len(trials), "complete": complete, "trials": trials,
            "summary": f"the delegate computes it wrongly: {where} differs; {cause}"}
