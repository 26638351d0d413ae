"""What cuts the time and memory ExecuTorch's lowering spends on a large program (the Qwen2-0.5B-shaped decoder of
``benchmarks/bench_generation.py``: 494 M parameters, 123 XNNPACK partitions).

None changes a program: the same partitions, the same delegates, the same bytes of weights.
:func:`cia_ops_collected_once`, a cache of what torch recomputes on every decomposition, is pipeline code that every
export installs. The patches that replace what ExecuTorch does upstream are registered workarounds
(``disable=("<name>",)`` leaves one out). Each has a test in ``tests/executorch/test_executorch_export_cost.py``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import heapq
import threading
from collections.abc import Iterator
from typing import Any

import torch

from hfexport.plugin import register_patch

__all__ = ["cia_ops_collected_once"]


@register_patch(
    "executorch.xnnpack.internals",
    "executorch.backends.xnnpack.xnnpack_preprocess.XnnpackBackend.copy_exported_program_for_preprocess",
)
def _patch_preprocess_copy_shares_weights(original: Any) -> Any:
    """Copies each partition's program for XNNPACK's ``preprocess`` without copying its weights.

    **Why**: ``lower_all_submodules_to_backend`` hands every partition to ``preprocess`` as
    ``copy.deepcopy(program)`` ("in case backends change graph inside preprocess method"), and makes all those
    copies before the first ``preprocess`` runs: every weight of the model is copied once more (Qwen2-0.5B-shaped:
    +2.5 GB of the export's peak, 7 s of ``Parameter.__deepcopy__``). XNNPACK's passes replace state-dict entries
    (constant propagation, batch-norm fusion) but never write into a weight, so the copy shares the tensors and
    copies the graph, the signature and the dicts, as ExecuTorch's own CUDA backend does in its low-memory mode
    (``CudaBackend.copy_exported_program_for_preprocess``).
    **Upstream**: pytorch/executorch ``exir/backend/backend_details.py`` (the deep copy) and
    ``backends/cuda/cuda_backend.py`` (the memoized copy, CUDA only); no issue found for XNNPACK.
    **Remove when**: ``XnnpackBackend`` (or ``BackendDetails``) copies with the weights shared (the test's program
    then hands ``preprocess`` its own weight tensors with ``disable=("_patch_preprocess_copy_shares_weights",)``).
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
    """Fuses each partition into its submodule and sorts the graph in place, instead of rebuilding the whole graph
    (and regenerating its Python code) once per partition.

    **Why**: ``to_backend`` fuses the partitions one after another with ``create_submodule_from_nodes``, which ends
    with ``legalize_graph(gm)``: a copy of every node of the owning graph into a new graph, assigned to ``gm.graph``,
    which regenerates and compiles the module's Python code. The cost is the partitions times the graph: the
    Qwen2-0.5B-shaped decoder (123 partitions over ~4,000 nodes) spent 34 s there. The fused graph only needs its
    nodes in a topological order (the fused call sits after the partition's last output, and users of an earlier
    output must move after it): the replacement fuses with ``skip_legalize_graph=True``, then moves the nodes that
    are out of order, keeping the rest where they are. The code is regenerated by the next pass that rebuilds the
    graph, as after any in-place edit.
    **Upstream**: pytorch/executorch ``exir/lowered_backend_module.py`` (``create_submodule_from_nodes``: "TODO :
    T153794167 Get rid of support for skipping legalize graph ... once we transition to using
    fuse_by_partitions"); none found for the cost.
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


# ── pipeline code: installed for every export by ExecutorchExporter.prepare, not a registered workaround ─────────
_CIA_OPS_CALLERS = ("torch.export.exported_program", "torch.export.decomp_utils")  # the names its callers call
_cia_lock = threading.Lock()
_cia_installed: list[tuple[Any, Any]] = []  # (module, original) while at least one export holds the cache
_cia_holders = 0


def _collected_once(original: Any) -> Any:
    """``original`` (torch's ``_collect_all_valid_cia_ops``) answered from a cache while the number of C++
    CompositeImplicitAutograd registrations, the only thing its answer depends on, stays the same."""
    cache: dict[int, frozenset[Any]] = {}

    @functools.wraps(original)
    def _collect_all_valid_cia_ops() -> set[Any]:
        key = len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
        if key not in cache:
            cache.clear()
            cache[key] = frozenset(original())
        return set(cache[key])  # each caller its own copy

    return _collect_all_valid_cia_ops


@contextlib.contextmanager
def cia_ops_collected_once() -> Iterator[None]:
    """While the ``with`` body runs, torch collects its preservable CompositeImplicitAutograd ops once, not on every
    ``run_decompositions`` and decomposition table.

    ``_collect_all_valid_cia_ops`` walks every op of every namespace (``torch.ops.aten``: 500 CIA ops among some
    2,600 overloads) on each call, and an ExecuTorch lowering calls it 17 times: 1.8 s of a 31 s toy export, about a
    third of a tiny model's. The exporter holds the cache for the whole export (``prepare``); nested and concurrent
    exports share it, and the last one out puts torch's function back.
    """
    import importlib

    global _cia_holders
    with _cia_lock:
        if _cia_holders == 0:
            modules = [importlib.import_module(name) for name in _CIA_OPS_CALLERS]
            originals = {id(m._collect_all_valid_cia_ops): m._collect_all_valid_cia_ops for m in modules}
            cached = {key: _collected_once(fn) for key, fn in originals.items()}  # one cache per function
            for module in modules:
                original = module._collect_all_valid_cia_ops
                _cia_installed.append((module, original))
                module._collect_all_valid_cia_ops = cached[id(original)]
        _cia_holders += 1
    try:
        yield
    finally:
        with _cia_lock:
            _cia_holders -= 1
            if _cia_holders == 0:
                while _cia_installed:
                    module, original = _cia_installed.pop()
                    module._collect_all_valid_cia_ops = original
