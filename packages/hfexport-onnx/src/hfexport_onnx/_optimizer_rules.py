"""A patch (stage 2, ``"onnx"`` scope) on onnxscript's rewriter, which the optimizer and the ORT fusions run: its
identity rules (``x + 0``, ``x * 1``, ...) match only the exact constants 0 and 1.

Importing this module registers the patch (``exporter_onnx`` imports it).
"""

from __future__ import annotations

import functools
from typing import Any

from hfexport.plugin import register_patch

__all__: list[str] = []


@register_patch("onnx", "onnxscript.rewriter._matcher.SimplePatternMatcher._match_constant")
def _patch_identity_constants_match_exactly(original: Any) -> Any:
    """A rewrite pattern's constant 0 or 1 matches only a graph constant equal to it; other constants keep
    onnxscript's tolerance.

    **Why**: a pattern constant matches a graph constant within ``math.isclose(rel_tol=1e-5, abs_tol=1e-8)``, so
    the optimizer's identity rules (``onnxscript/rewriter/rules/common/_no_op.py``: ``x + 0``, ``x - 0``, ``x * 1``,
    ``x / 1`` become ``Identity``) also remove an ``Add`` of an epsilon of up to 1e-8 and a ``Mul`` by
    ``1 +- 1e-5``. MuseGlimmer's post-norm adds ``post_norm_eps=1e-8`` before its square root: with the ``Add``
    gone its ONNX model differed from eager by 2.0e-4 (1.4e-5 unoptimized; the ``x + 0`` rule alone, ONNX
    Runtime's own graph optimizations off, makes the difference). Fusion patterns that compare other constants
    (GELU's 0.044715, ...) keep the tolerance.
    **Upstream**: none found; onnxscript 0.7.2 ``_pattern_ir.Constant`` (``rel_tol=1e-5, abs_tol=1e-8`` defaults)
    and ``_matcher.SimplePatternMatcher._match_constant``.
    **Remove when**: the identity rules compare exactly; the test's ``x / sqrt(mean(x**2) + 1e-8)`` of small values
    matches eager with ``disable=("_patch_identity_constants_match_exactly",)``.
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
