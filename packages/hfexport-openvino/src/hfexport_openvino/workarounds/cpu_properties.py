"""The CPU plugin's properties that work around its bugs, for the step ``Core.compile_model`` (after stage 3):
registered as the ``openvino_cpu_property`` kind, each returns properties, recorded in the manifest
(``openvino.cpu_properties``) so that a loaded artifact compiles as its verified export did."""

from __future__ import annotations

from hfexport.plugin import register_workaround

__all__: list[str] = []


@register_workaround("openvino_cpu_property", "openvino")
def _fix_cpu_snippets_disabled() -> dict[str, str]:
    """Compiles with ``SNIPPETS_MODE=DISABLE``: element-wise chains run op by op, not as JIT-fused snippets.

    **Why**: with snippets the CPU plugin computed Inkling's text decoder wrong (3.2 to 5.7 from eager, NaN at the
    second shape, varying between compilations) and JetMoE (0.70); disabled: 7.7e-7 (JetMoE 1.8e-7). Cost on MiniLM
    (batch 8 x 128, one thread): 385 against 372 ms, +3.6%.
    **Upstream**: openvinotoolkit/openvino#37989 (open, seen on 2026.3); #25744 (right once outputs are added).
    **Remove when**: Inkling matches eager with ``disable=("_fix_cpu_snippets_disabled",)``
    (``test_inkling_with_snippets_does_not_match_eager`` then fails).
    """
    return {"SNIPPETS_MODE": "DISABLE"}
