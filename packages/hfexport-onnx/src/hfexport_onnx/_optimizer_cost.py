"""Workarounds that cut the time onnxscript's optimizer spends on a large graph (stage 5's step ``onnxscript
optimizer``, and the optimizer runs inside ``onnxscript ort_fusions``).

They change no graph: the same rules fire on the same nodes. Each is a registered patch of the ``"onnx"`` scope
(installed in stage 1, active to the end of the export; ``disable=("<name>",)`` leaves it out) with a test in
``tests/onnx/test_onnx_optimizer_cost.py``.
"""

from __future__ import annotations

import functools
from typing import Any

from hfexport.plugin import register_patch

__all__: list[str] = []


@register_patch("onnx", "onnxscript.rewriter._matcher.SimplePatternMatcher.match")
def _patch_multi_output_match_checks_its_anchor_first(original: Any) -> Any:
    """A rewrite rule with several output nodes tries a node only when that node matches the rule's first output
    node (its op type, domain and attributes): the answer the full match gives, without enumerating the graph.

    **Why**: onnxscript's optimizer applies its default rules to every node, two iterations per call, and the
    export runs it four times (``ONNXProgram.optimize``; twice in ``ort_fusions``' ``_pre_optimize``, once at their
    end). For a rule with several output nodes (``SlicesSplit``: two ``Slice`` of one input into one ``Split``),
    ``SimplePatternMatcher.match`` first indexes every node of the graph by op type, then tries the combinations
    with the given node as the first output; the given node is compared with the first output node only inside
    that loop. Every node of the graph thus walks the whole graph: quadratic in the node count. On the
    Qwen2-0.5B-shaped decoder of ``benchmarks/bench_generation.py`` (fp32, 24 layers) that walk was 11.1 M node
    visits, about 20 s of the export's 85 s (cProfile, load ~3). A node that fails the first output node's
    node-level check fails every combination, so it is refused before the walk; the match of every other node
    is onnxscript's own. With a tracer (``debug=True``) the original runs, so that its trace is unchanged.
    **Upstream**: microsoft/onnxscript#1734 (the brute-force multi-output matcher, "a simple, but robust,
    implementation" by its own comment); no issue on its cost found (onnxscript 0.7.2).
    **Remove when**: onnxscript's ``SimplePatternMatcher.match`` checks the given node before indexing the graph
    (the test's multi-output rule then walks no more nodes with this patch disabled).
    """
    from onnxscript.rewriter._basics import MatchResult

    @functools.wraps(original)
    def match(self: Any, model: Any, graph_or_function: Any, node: Any, *, verbose: int = 0,
              remove_nodes: bool = True, tracer: Any = None) -> Any:
        pattern = self.pattern
        if tracer is None and not pattern.has_single_output_node:
            refused = MatchResult()
            if not pattern.output_nodes[0].matches(node, refused):
                return refused
        return original(self, model, graph_or_function, node, verbose=verbose, remove_nodes=remove_nodes,
                        tracer=tracer)

    return match
