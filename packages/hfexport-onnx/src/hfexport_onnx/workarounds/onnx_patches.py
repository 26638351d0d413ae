"""Stage 2, ONNX patches: ``@register_patch("onnx.internals", ...)`` factories on the internals of torch.onnx and of
onnxscript's rewriter (which the optimizer and the ORT fusions run), active from stage 2 to the end of the export."""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from hfexport.plugin import register_patch

__all__: list[str] = []


@register_patch("onnx.internals", "torch.onnx._internal.exporter._core._handle_output_node")
def _patch_constant_outputs_left_out(original: Any) -> Any:
    """Leaves int, float, bool and str outputs out of the ONNX graph; the manifest's ``output_constants`` has them.

    **Why**: torch.onnx reads ``.name`` of every output: Granite 4 Vision, which returns ``(layer index, features)``
    pairs, failed with ``AttributeError: 'int' object has no attribute 'name'``.
    **Upstream**: pytorch/pytorch#160150 (``_core._handle_output_node`` skips ``None`` only).
    **Remove when**: a module returning ``(x + 1, 3)`` exports with ``disable=("_patch_constant_outputs_left_out",)``.
    """

    def handle_output_node(node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
        outputs = node.args[0]
        if isinstance(outputs, (tuple, list)) and any(_is_constant(o) for o in outputs):
            # The original reads only the node's args and name; a stand-in keeps the graph's users untouched.
            node = types.SimpleNamespace(name=node.name, args=([o for o in outputs if not _is_constant(o)],))
        return original(node, *args, **kwargs)

    return handle_output_node


def _is_constant(output: Any) -> bool:
    return isinstance(output, (int, float, bool, str))


@register_patch("onnx.internals", "onnxscript.rewriter._matcher.SimplePatternMatcher.match")
def _patch_multi_output_match_checks_its_anchor_first(original: Any) -> Any:
    """A multi-output rewrite rule tries a node only if it matches the rule's first output node (op, attributes).

    **Why**: ``SimplePatternMatcher.match`` indexes the whole graph before comparing the node, so every node walks the
    graph (quadratic): 11.1 M node visits, about 20 of 85 s, on the Qwen2-0.5B-shaped decoder of bench_generation.py.
    **Upstream**: microsoft/onnxscript#1734 (the brute-force multi-output matcher); no issue on its cost (0.7.2).
    **Remove when**: ``match`` checks the node before indexing the graph (tests/onnx/test_onnx_optimizer_cost.py's
    rule walks no more nodes with this patch disabled).
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


@register_patch("onnx.internals", "onnxscript.rewriter._matcher.SimplePatternMatcher._match_constant")
def _patch_identity_constants_match_exactly(original: Any) -> Any:
    """A rewrite pattern's constant 0 or 1 matches only a graph constant equal to it; others keep the tolerance.

    **Why**: constants match within ``isclose(rel_tol=1e-5, abs_tol=1e-8)``, so the ``x + 0`` rule removed
    MuseGlimmer's ``Add`` of ``post_norm_eps=1e-8``: 2.0e-4 from eager (1.4e-5 unoptimized).
    **Upstream**: none found (onnxscript 0.7.2: ``_pattern_ir.Constant``'s defaults, ``_match_constant``).
    **Remove when**: the identity rules compare exactly (the test's ``x / sqrt(mean(x**2) + 1e-8)`` matches eager
    with ``disable=("_patch_identity_constants_match_exactly",)``).
    """

    @functools.wraps(original)
    def _match_constant(self: Any, pattern_constant: Any, value: Any) -> bool:
        expected = pattern_constant.value
        if isinstance(expected, int | float) and expected in (0, 1) and value.const_value is not None:
            try:
                found = value.const_value.numpy()
            except FileNotFoundError:
                found = None
            if found is not None and found.ndim == 0 and found.item() != expected:
                return self.fail(f"Constant value mismatch: expected exactly {expected}, got {found.item()}.")
        return original(self, pattern_constant, value)

    return _match_constant
